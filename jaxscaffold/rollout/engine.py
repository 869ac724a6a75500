"""The sampler: a slot-based KV-cache engine for multi-turn, token-in-token-out rollouts.

The engine owns `batch_size` cache *slots*. A slot holds one conversation's token history
as keys/values; `extend` prefills new tokens (a prompt, an environment observation) into
chosen slots, `generate` decodes in chosen slots until each stops, and `release` empties a
slot for the next episode (continuous batching: a finished episode's slot is refilled while
others are mid-episode, and a slot waiting for its environment simply sits out a decode).

Compiled programs are bounded by bucketing: prefill lengths round up to `prefill_buckets`,
decode lengths to `decode_buckets`, and (a windowed backend: both layouts') the cache prefix a
call attends over to `window_buckets` (128 x 1, 1.5, 2, 3, 4, 6, ...; a prefill, the powers
of two among them; all from `jaxscaffold.buckets`), so a step reads about the filled part of
the cache, not its capacity: a decode runs in chunks, each in the smallest window that holds
the longest row, until the rows stop. Batch and cache sizes are fixed per engine. Each chunk
runs inside one jitted `lax.while_loop` with the cache donated. How a step runs (the weight
layout, the cache, the kernels) is the sampler's backend's (`jaxscaffold.backends`), chosen
once, at construction, from the platform or `layout`.

The cache is contiguous (each slot `max_len` tokens) or, with `kv_cache="paged"` (the stacked
layout), one pool of pages with a page table per slot (`qwen3.PagedKVCache`): the sampler
takes pages for a slot as its tokens arrive (`rollout.pages.PageTable`, on the host) and
returns them when it is released, so rows hold what they fill; on a mesh the pool is split over
the data shards with the rows, each row taking its shard's pages. A decode row that finds no
free page for its next token ends its turn with finish_reason "pages" (counted in
`rows_out_of_pages`); an `extend` the pool cannot hold raises ContextOverflow.

A call that serves few of the slots (a returning observation, a few rows still decoding)
runs on those rows alone (`row_buckets`): they are gathered into a smaller batch, run, and
written back, so its cost follows its rows, not the slots. A prefill goes further: it gathers
down to two rows (`prefill_row_buckets`), and rows of very different lengths (a long first
prompt, short observations) are prefilled in separate calls where that pads less
(`prefill_calls`).

Sampling keys are per row and per position: the token at absolute position p of a row with
seed s is drawn with `fold_in(key(s), p)`, so a row is reproducible from its seed whatever
slot or batch it runs in.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterable, Mapping, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from jaxscaffold import backends, buckets, compiler
from jaxscaffold.models import qwen3, sharded_attention
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.sharding import DEFAULT_RULES, ShardingRules
from jaxscaffold.rollout.pages import PageTable
from jaxscaffold.rollout.sampling import SamplingConfig, sample

class ContextOverflow(ValueError):
    """A slot has no room for the tokens it was given."""


@dataclasses.dataclass(frozen=True)
class Generation:
    """One slot's output of a `generate` call."""

    tokens: np.ndarray  # int32 [n]
    logprobs: np.ndarray  # f32 [n], under the unmodified policy (T=1, no truncation)
    sampling_logprobs: np.ndarray  # f32 [n], under the distribution sampled from
    finish_reason: str  # "stop" (a stop token, included in tokens), "length", or "pages" (a paged cache's pool was empty)


@flax.struct.dataclass  # a pytree (frozen): jitted steps take and return it
class SamplerState:
    """Device state of all slots: the KV cache and each slot's next-token logits."""

    cache: qwen3.KVCache | qwen3.PagedKVCache
    logits_BV: jax.Array  # f32: the model's prediction after each slot's last cached token


_MIN_WINDOW = 128  # the smallest cache prefix a windowed call attends over
_MIN_GATHERED_PREFILL = (2, 64)  # rows, tokens (rows x width): see `Sampler._prefill_batch`


@dataclasses.dataclass(frozen=True)
class Programs:
    """Everything a sampler's compiled programs depend on besides the shapes of their
    arguments. Hashable: samplers with equal settings share one set of compiled programs in a
    process (a training run builds its samplers anew, a test suite many times over)."""

    config: Qwen3Config
    sampling: SamplingConfig
    stop_ids: tuple[int, ...]
    backend: Any  # a `jaxscaffold.backends` backend: the weight layout, the cache, the decode step
    mesh: Any = None
    rules: ShardingRules = DEFAULT_RULES

    def weights(self, params):
        """The parameters in the backend's layout (a no-op on `prepare`d ones)."""
        return self.backend.prepare(params, self.config)

    def state_shardings(self):
        """Shardings of the SamplerState (None without a mesh)."""
        if self.mesh is None:
            return None
        r, m = self.rules, self.mesh
        kv = self.backend.kv_sharding(self.config, m, r)
        if self.backend.kv_cache == "paged":
            cache = qwen3.PagedKVCache(k=kv, v=kv, table=r.sharding(m, ("batch", None)), lengths=r.sharding(m, ("batch",)))
            return SamplerState(cache=cache, logits_BV=r.sharding(m, ("batch", "vocab")))
        cache = qwen3.KVCache(k=kv, v=kv, segment_ids=r.sharding(m, ("batch", "cache_seq")),
                              lengths=r.sharding(m, ("batch",)))
        return SamplerState(cache=cache, logits_BV=r.sharding(m, ("batch", "vocab")))

    def constrain(self, state: SamplerState) -> SamplerState:
        shardings = self.state_shardings()
        return state if shardings is None else jax.lax.with_sharding_constraint(state, shardings)


def _bucket(n: int, sizes, what: str) -> int:
    return buckets.fit(n, sizes, what=what, error=ContextOverflow)


@functools.partial(compiler.jit, static_argnames=("programs",))
def _prepare(params, *, programs: Programs):
    return programs.weights(params)


def _paged_mesh(programs: Programs):
    """A paged cache's calls are traced under the sampler's mesh, so that each device reads
    and writes its own part of the pool (`paged_attention.write_and_attend`)."""
    return sharded_attention.kernel_mesh(programs.mesh if programs.backend.kv_cache == "paged" else None, programs.rules)


@functools.partial(compiler.jit, static_argnames=("programs", "window"), donate_argnames=("state",))
def _prefill(params, state: SamplerState, tokens_BT, segments_BT, *, programs: Programs, window: int):
    c, backend = programs.config, programs.backend
    params = programs.weights(params)
    with _paged_mesh(programs):
        h, cache = backend.hidden_states(params, c, tokens_BT, segment_ids_BT=segments_BT, cache=state.cache,
                                         window=window)
    n = jnp.sum(segments_BT != 0, axis=1)
    last = jnp.take_along_axis(h, jnp.maximum(n - 1, 0)[:, None, None], axis=1)
    new_logits = backend.unembed(params, c, last)[:, 0]  # only the last position: no [B, T, V]
    logits = jnp.where((n > 0)[:, None], new_logits, state.logits_BV)
    return programs.constrain(SamplerState(cache=cache, logits_BV=logits))


@functools.partial(compiler.jit, static_argnames=("programs", "steps", "window"), donate_argnames=("state",))
def _decode(params, state: SamplerState, seeds_B, active_B, max_new_B, *, programs: Programs, steps: int,
            window: int):
    c, backend, b = programs.config, programs.backend, state.logits_BV.shape[0]
    params = programs.weights(params)
    stop_ids = jnp.asarray(programs.stop_ids, jnp.int32)
    base_keys = jax.vmap(jax.random.key)(seeds_B)

    def cond(carry):
        i, _, done, *_ = carry
        return (i < steps) & ~jnp.all(done)

    def body(carry):
        i, st, done, stopped, n, toks, lp, slp = carry
        keys = jax.vmap(jax.random.fold_in)(base_keys, st.cache.lengths)
        tok, tok_lp, tok_slp = sample(st.logits_BV, keys, programs.sampling)
        live = ~done
        toks = toks.at[:, i].set(jnp.where(live, tok, 0))
        lp = lp.at[:, i].set(jnp.where(live, tok_lp, 0.0))
        slp = slp.at[:, i].set(jnp.where(live, tok_slp, 0.0))
        n = n + live
        hit = live & jnp.isin(tok, stop_ids)
        stopped = stopped | hit
        # Feed the sampled token so the cache always holds the whole history.
        with _paged_mesh(programs):
            h, cache = backend.hidden_states(params, c, tok[:, None], segment_ids_BT=live[:, None].astype(jnp.int32),
                                             cache=st.cache, window=window)
        logits = jnp.where(live[:, None], backend.unembed(params, c, h)[:, 0], st.logits_BV)
        done = done | hit | (n >= max_new_B)
        return i + 1, SamplerState(cache=cache, logits_BV=logits), done, stopped, n, toks, lp, slp

    zeros_i = jnp.zeros((b, steps), jnp.int32)
    zeros_f = jnp.zeros((b, steps), jnp.float32)
    init = (jnp.int32(0), state, ~active_B | (max_new_B <= 0), jnp.zeros((b,), bool),
            jnp.zeros((b,), jnp.int32), zeros_i, zeros_f, zeros_f)
    _, state, _, stopped, n, toks, lp, slp = jax.lax.while_loop(cond, body, init)
    return programs.constrain(state), (toks, lp, slp, n, stopped)


def _map_rows(fn, state: SamplerState, *more: SamplerState) -> SamplerState:
    """`fn(x, *ys, axis=...)` on every array of the state, with the axis that holds its rows
    (a per-layer cache's buffers: 0; a stacked cache's: 1, after the layers)."""
    kv_axis = 0 if isinstance(state.cache.k, (tuple, list)) else 1
    def each(get, axis):
        return jax.tree.map(lambda x, *ys: fn(x, *ys, axis=axis), get(state), *map(get, more))
    cache = qwen3.KVCache(k=each(lambda s: s.cache.k, kv_axis), v=each(lambda s: s.cache.v, kv_axis),
                          segment_ids=each(lambda s: s.cache.segment_ids, 0), lengths=each(lambda s: s.cache.lengths, 0))
    return SamplerState(cache=cache, logits_BV=each(lambda s: s.logits_BV, 0))


@compiler.jit
def _take_rows(state: SamplerState, rows_R) -> SamplerState:
    """The rows `rows_R` of the state as a batch of their own (an index past the slots: an empty row)."""
    return _map_rows(lambda x, axis: jnp.take(x, rows_R, axis=axis, mode="fill", fill_value=0), state)


@functools.partial(compiler.jit, donate_argnames=("state",))
def _put_rows(state: SamplerState, rows: SamplerState, rows_R) -> SamplerState:
    """`state` with `rows` (from `_take_rows`) written back (rows past the slots dropped)."""
    return _map_rows(lambda x, y, axis: x.at[(slice(None),) * axis + (rows_R,)].set(y, mode="drop"), state, rows)


@dataclasses.dataclass(frozen=True)
class SamplerOptions:
    """How a sampler draws tokens, stores its cache and runs its steps: everything but its
    model, its size (slots, context) and its placement (mesh). The defaults suit any platform.

    Attributes:
      sampling: temperature / top-p / top-k (greedy when temperature is 0).
      cache_dtype: KV cache dtype (bf16 halves cache memory and bandwidth).
      layout: which backend decodes (`jaxscaffold.backends`). "auto": the platform's;
        "per_layer": the CPU's (layers unrolled over per-layer weights and cache buffers,
        `backends.cpu.decode_layout`, which XLA:CPU reads in place); "stacked": the TPU / GPU
        one (the stacked weights scanned, the compact program those compilers prefer).
      column_blocks: per_layer only: matrices split into this many blocks so each of a
        CPU's cores runs one (default: the core count, at most 4, on an unsharded CPU
        sampler; else 1).
      kv_cache: "contiguous" (`max_len` slots a row) or "paged" (the stacked layout only):
        one pool of `kv_pages` pages of `page_size` tokens (0: enough for every slot at
        `max_len`), pages taken as rows grow.
      prefill_buckets, decode_buckets: the lengths a prefill / a decode chunk is rounded up to
        (default: `buckets.ladder(16, max_len)`).
      window_buckets: the cache prefixes a decode chunk may attend over (default: 128 x 1,
        1.5, 2, 3, ... up to max_len; a prefill, the powers of two among them); `(max_len,)`
        attends over the whole cache every step (the reference the windows must equal).
      row_buckets: batch sizes a call that serves few slots runs at (its rows gathered, run,
        written back); the last is batch_size, the whole batch in place. Default on an
        unsharded per_layer (CPU) sampler: 8, 16, 32, ... below batch_size (measured there:
        a call's cost follows its batch); else `(batch_size,)`, every call on all slots.
      prefill_row_buckets: the same for a prefill (`extend`). Default on a per_layer sampler
        whose `row_buckets` gather (more than one bucket): 2, 4, ... below its smallest too (a
        prefill's cost follows its rows: each row is `width` tokens); else `row_buckets`. A
        gathered prefill runs at least 2 rows and 64 tokens (`_prefill_batch`). More than one
        bucket on a per_layer sampler: a prefill's rows are also split by width
        (`prefill_calls`), where measured bitwise alike (the stacked layout rounds a row
        differently in calls of other shapes on CPU).
      backend: a `jaxscaffold.backends` backend to decode with instead of the one `layout`
        and `kv_cache` choose (a test runs the TPU backend's kernels on CPU this way).
    """

    sampling: SamplingConfig = SamplingConfig()
    cache_dtype: str = "bfloat16"
    layout: str = "auto"
    column_blocks: int | None = None
    kv_cache: str = "contiguous"
    page_size: int = 64
    kv_pages: int = 0
    prefill_buckets: Sequence[int] | None = None
    decode_buckets: Sequence[int] | None = None
    window_buckets: Sequence[int] | None = None
    row_buckets: Sequence[int] | None = None
    prefill_row_buckets: Sequence[int] | None = None
    backend: Any = None


class Sampler:
    """Jitted prefill and decode over a fixed set of cache slots.

    Args:
      config: the model config (static).
      batch_size: number of slots (rows decoded together).
      max_len: cache capacity per slot, in tokens.
      stop_ids: tokens that end a turn (kept in the output): the tokenizer's `eos_ids`, or ()
        to decode every turn to its token budget. Required, and checked against the vocabulary:
        a default (Qwen3's ids) once let the word-vocabulary runs decode past every end.
      options: how tokens are drawn, the cache stored and the steps run (`SamplerOptions`).
      mesh, rules: shard the cache (rows over the batch axes, kv heads over `tensor`);
        parameters keep the shardings they were placed with.

    Parameters: pass `prepare(params)` (once per parameter update); stacked parameters
    also work, converted inside every call (a copy of the weights each time).
    """

    # A prefill call's fixed cost in `prefill_calls`' units (rows x width x window): about what a
    # 64-token row over a 1024 window costs, 5-15 ms on a loaded CPU (the tiny model, measured),
    # so a call is split only where that saves more than a call's dispatch and row gathering.
    prefill_call_cost = 64 * 1024

    def __init__(self, config: Qwen3Config, *, batch_size: int, max_len: int, stop_ids: Sequence[int],
                 options: SamplerOptions = SamplerOptions(), mesh=None, rules: ShardingRules = DEFAULT_RULES):
        if config.is_embedding:
            raise ValueError("an embedding model cannot generate")
        o = self.options = options
        self.config, self.batch_size, self.max_len = config, batch_size, max_len
        self.sampling, self.cache_dtype = o.sampling, o.cache_dtype
        outside = config.ids_outside_vocabulary(stop_ids)
        if outside:
            raise ValueError(f"stop ids {outside} are outside the model's vocabulary of {config.vocab_size}: "
                             "pass the tokenizer's eos_ids (or () to never stop)")
        self.stop_ids = np.asarray(sorted(set(stop_ids)), np.int32)
        self.prefill_buckets = tuple(o.prefill_buckets or buckets.ladder(16, max_len))
        self.decode_buckets = tuple(o.decode_buckets or buckets.ladder(16, max_len))
        # Windows (a windowed backend's): a decode step reads its whole window (at window 256,
        # about a fifth of a ~100M-model decode step on CPU), hence half-octave steps; a prefill
        # reads it once, not once a step: powers of two, half the programs to compile.
        self.window_buckets = tuple(o.window_buckets or buckets.ladder(_MIN_WINDOW, max_len, per_octave=2))
        if self.window_buckets[-1] != max_len or list(self.window_buckets) != sorted(set(self.window_buckets)):
            raise ValueError(f"window_buckets {self.window_buckets}: increasing, the last one max_len={max_len}")
        powers = set(buckets.ladder(_MIN_WINDOW, max_len))
        self.prefill_window_buckets = tuple(w for w in self.window_buckets if w in powers)
        self.mesh, self.rules = mesh, rules
        self.backend = o.backend or backends.for_sampler(o.layout, mesh=mesh, column_blocks=o.column_blocks,
                                                         kv_cache=o.kv_cache, page_size=o.page_size)
        self.layout = self.backend.layout
        self.paged = self.backend.kv_cache == "paged"
        if self.paged:
            self.page_shards = self._page_shards()
            self.kv_pages = o.kv_pages or self.backend.pages_for(batch_size, max_len, self.page_shards)
            self.page_table = self._new_page_table()
        self.rows_out_of_pages = 0  # decode rows ended for want of a page (finish_reason "pages")
        # prefill calls made, the rows they computed (padding included) and their rows x width x window
        self.prefill_counts = {"calls": 0, "rows": 0, "work": 0}
        # the widths, windows and decode steps calls have met (`compile_programs(shapes=...)`)
        self.shapes_met: dict[str, set[int]] = {k: set() for k in ("width", "prefill_window", "decode_window",
                                                                    "decode_steps")}
        row_buckets = o.row_buckets
        if row_buckets is None:
            row_buckets = buckets.ladder(8, batch_size) if mesh is None and self.layout == "per_layer" else (batch_size,)
        self.row_buckets = tuple(row_buckets)
        prefill_row_buckets = o.prefill_row_buckets
        if prefill_row_buckets is None:
            gathers = len(self.row_buckets) > 1 and self.layout == "per_layer"
            below = buckets.ladder(_MIN_GATHERED_PREFILL[0], self.row_buckets[0])[:-1] if gathers else ()
            prefill_row_buckets = below + self.row_buckets
        self.prefill_row_buckets = tuple(prefill_row_buckets)
        for name, sizes in (("row_buckets", self.row_buckets), ("prefill_row_buckets", self.prefill_row_buckets)):
            if sizes[-1] != batch_size or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
                raise ValueError(f"{name} {sizes}: increasing from 1 or more, the last one batch_size={batch_size}")
            if self.paged and sizes != (batch_size,):  # page tables are kept by slot
                raise ValueError(f"{name} {sizes}: a paged sampler runs every call on all slots")
        self.programs = Programs(config, o.sampling, tuple(int(i) for i in self.stop_ids), self.backend, mesh, rules)

    # ---------------------------------------------------------------- state

    def _new_page_table(self) -> PageTable:
        page = self.backend.page_size
        return PageTable(self.batch_size, self.kv_pages, page, -(-self.max_len // page), shards=self.page_shards)

    def _page_shards(self) -> int:
        """Data shards of the mesh, each with its part of the pool and its rows (one
        without a mesh): every batch axis of the mesh must divide the rows."""
        if self.mesh is None:
            return 1
        names = self.rules.batch if isinstance(self.rules.batch, tuple) else (self.rules.batch,)
        batch_axes = tuple(a for a in names if a in self.mesh.axis_names and self.mesh.shape[a] > 1)
        rows = sharded_attention.paged_axes(self.mesh, self.batch_size, 1, self.rules)[0]
        if rows != batch_axes:
            raise ValueError(f"batch_size={self.batch_size} must split over the mesh's batch axes {batch_axes} "
                             "(a paged cache gives each data shard its rows' pages)")
        return math.prod(self.mesh.shape[a] for a in rows)

    def init_state(self) -> SamplerState:
        """All slots empty (a paged sampler: all pages free; one state at a time)."""
        c = self.config
        if self.paged:
            self.page_table = self._new_page_table()
            cache = self.backend.empty_cache(c, self.batch_size, self.max_len, self.cache_dtype, pages=self.kv_pages)
        else:
            cache = self.backend.empty_cache(c, self.batch_size, self.max_len, self.cache_dtype)
        state = SamplerState(
            cache=cache,
            logits_BV=jnp.zeros((self.batch_size, c.vocab_size), jnp.float32))
        shardings = self.programs.state_shardings()
        return state if shardings is None else jax.device_put(state, shardings)

    def _placed(self, params, state: SamplerState) -> SamplerState:
        """`state` placed where a call on `params` leaves it (a mesh-less sampler's fresh state
        is not committed to a device; every state a call returns is, on the parameters' device or
        one-device mesh): jit keys its programs on their arguments' placement, so a rollout's first
        calls would otherwise run (and `compile_programs` compile) a second variant of each."""
        leaf = jax.tree.leaves(params)[0]
        if self.mesh is not None or state.logits_BV.committed or not getattr(leaf, "committed", False):
            return state
        sharding = leaf.sharding
        if isinstance(sharding, NamedSharding):  # replicated there, as a call's outputs are
            sharding = NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
        elif not isinstance(sharding, jax.sharding.SingleDeviceSharding):
            return state
        return jax.device_put(state, sharding)

    def lengths(self, state: SamplerState) -> np.ndarray:
        """Tokens held by each slot (one small device-to-host copy)."""
        return np.asarray(state.cache.lengths)

    def release(self, state: SamplerState, slots: Sequence[int]) -> SamplerState:
        """Empties slots (their cached tokens are forgotten) for new episodes."""
        idx = jnp.asarray(list(slots), jnp.int32)
        cache = state.cache
        if self.paged:  # the pages go back to the pool; the table reaches the device with the next call
            for slot in slots:
                self.page_table.release(slot)
            return SamplerState(cache=cache._replace(lengths=cache.lengths.at[idx].set(0)), logits_BV=state.logits_BV)
        cache = cache._replace(lengths=cache.lengths.at[idx].set(0),
                               segment_ids=cache.segment_ids.at[idx].set(0))
        return SamplerState(cache=cache, logits_BV=state.logits_BV)

    def room(self, slot: int, length: int) -> int:
        """Tokens a slot holding `length` can still take (one cache slot stays spare); a paged
        sampler's, also within its pages and the free pool (which the other slots share)."""
        room = self.max_len - 1 - length
        return min(room, self.page_table.room(slot, length)) if self.paged else room

    def _with_table(self, state: SamplerState) -> SamplerState:
        """The state with the host's page tables (a paged sampler's, before each call)."""
        if not self.paged:
            return state
        table = self.page_table.table.copy()
        shardings = self.programs.state_shardings()
        table = jnp.asarray(table) if shardings is None else jax.device_put(table, shardings.cache.table)
        return SamplerState(cache=state.cache._replace(table=table), logits_BV=state.logits_BV)

    def _on_rows(self, state: SamplerState, slots: Sequence[int], lengths: np.ndarray, run, rows: int | None = None):
        """`run(state, slots, lengths)` on `rows` rows (default: the fewest of `row_buckets`
        that hold `slots`): the whole state when that is the batch, else a batch of those rows
        gathered (slot i of it: slots[i]) and written back. Returns (the new state, what `run`
        returned besides it)."""
        rows = rows or _bucket(max(len(slots), 1), self.row_buckets, "a row count")
        if rows >= self.batch_size:
            return run(state, list(slots), lengths)
        index = np.full(rows, self.batch_size, np.int32)  # past the slots: padding rows, empty
        index[:len(slots)] = slots
        sub_lengths = np.zeros(rows, lengths.dtype)
        sub_lengths[:len(slots)] = lengths[list(slots)]
        index = jnp.asarray(index)
        sub, out = run(_take_rows(state, index), list(range(len(slots))), sub_lengths)
        return _put_rows(state, sub, index), out

    def _window(self, needed: int, buckets: Sequence[int]) -> int:
        """The cache prefix a call attends over (a windowed backend's): the bucket holding
        `needed` slots, so a decode step reads the filled part of the cache, not the whole
        capacity."""
        if not self.backend.windowed:
            return self.max_len
        return _bucket(min(needed, self.max_len), buckets, "a window")

    def decode_window(self, tokens: int) -> int:
        """The cache prefix a decode chunk attends over while its longest row holds up to
        `tokens` (its new token included)."""
        return self._window(tokens, self.window_buckets)

    def lower_decode(self, params, state: SamplerState, *, window: int, steps: int = 1):
        """The program of one `generate` chunk (up to `steps` decode steps over the first
        `window` cache slots), lowered for `params` and `state`, which may be abstract
        (`jax.ShapeDtypeStruct`s, e.g. `jax.eval_shape(sampler.init_state)`): for cost and
        memory analyses; nothing is compiled or run."""
        rows = lambda dtype: jax.ShapeDtypeStruct((self.batch_size,), dtype)  # noqa: E731
        return _decode.lower(params, state, rows(jnp.uint32), rows(jnp.bool_), rows(jnp.int32),
                             programs=self.programs, steps=steps, window=window)

    def prepare(self, params):
        """The parameters in the layout this sampler decodes with: what to pass to `extend`
        and `generate` (made once per parameter update; the stacked ones are not changed)."""
        if self.backend.is_prepared(params):
            return params
        return _prepare(params, programs=self.programs)

    def compile_programs(self, params, state: SamplerState, *, max_decode: int = 1,
                         shapes: Mapping[str, Iterable[int]] | None = None) -> int:
        """Compiles, ahead of time, the programs later calls may run, so that they compile
        nothing (nothing runs but a gather of rows; `state`, any state of this sampler, is not
        consumed): for every row bucket, the decode chunk over each window, up to `max_decode`
        steps a chunk (the longest turn or decode chunk a caller asks for at once), and the
        prefill of each width bucket over each window that holds it; the gathers of rows; a
        release of one slot.

        `shapes` (e.g. `shapes_met`, after a rollout) narrows the widths, windows and decode
        steps to those sets, still for every row bucket and every width x window pair: which
        rows share a call follows the envs' timing, so a rollout of the same rows meets other
        (row bucket, width, window) combinations than the one before it, and an asynchronous
        run compiles in its timed part what its warm-up did not meet. `params` as passed to
        `extend`: prepared, and placed as the calls get them (a program's key includes its
        arguments' placement). Returns the number of programs (those compiled before are
        cached: calling it twice compiles nothing)."""
        windowed = self.backend.windowed
        longest = _bucket(max(1, min(max_decode, self.max_len)), self.decode_buckets, "a decode")
        steps = [s for s in self.decode_buckets if s <= longest]
        widths = self.prefill_buckets
        windows = self.window_buckets if windowed else (self.max_len,)
        prefill_windows = self.prefill_window_buckets if windowed else (self.max_len,)
        if shapes is not None:
            steps, widths = sorted(shapes["decode_steps"]), sorted(shapes["width"])
            windows, prefill_windows = sorted(shapes["decode_window"]), sorted(shapes["prefill_window"])
        # placed as a call leaves it (`_placed`): the one placement later calls meet
        state = self._with_table(self._placed(params, state))
        lowered, subs = [], {}  # subs: row bucket -> the gathered state a call on that many rows takes

        def rows_state(rows: int):
            if rows >= self.batch_size:
                return state
            if rows not in subs:
                index = jnp.asarray(np.zeros(rows, np.int32))
                # run (a small gather): its output's placement is part of later programs' keys, and
                # is a call's (the rows written back are a prefill's or a decode's output)
                subs[rows] = _take_rows(state, index)
                lowered.extend([_take_rows.lower(state, index), _put_rows.lower(state, subs[rows], index)])
            return subs[rows]

        for rows in self.row_buckets:
            sub = rows_state(rows)
            per_row = [jnp.asarray(np.zeros(rows, np.uint32))] + [self._put(np.zeros(rows, t)) for t in (np.bool_, np.int32)]
            for window in windows:
                for n in steps:
                    lowered.append(_decode.lower(params, sub, *per_row, programs=self.programs, steps=n, window=window))
        for width in widths:
            for rows in sorted({self._prefill_batch(n, width) for n in range(1, self.batch_size + 1)}):
                sub = rows_state(rows)
                ids = self._put(np.zeros((rows, width), np.int32))
                for window in (w for w in prefill_windows if w >= width):
                    lowered.append(_prefill.lower(params, sub, ids, ids, programs=self.programs, window=window))
        for program in lowered:
            program.compile()
        if not self.paged:  # its eager updates (a paged one's pages are the host's)
            jax.block_until_ready(self.release(state, [0]))
        return len(lowered)

    # ---------------------------------------------------------------- prefill

    def extend(self, params, state: SamplerState, tokens: Mapping[int, Sequence[int]],
               lengths: np.ndarray | None = None) -> SamplerState:
        """Appends tokens to the given slots (others are untouched): prefill only the new
        tokens. Raises ContextOverflow when a slot has no room (one slot stays spare)."""
        lengths = self.lengths(state) if lengths is None else lengths
        longest = max((len(t) for t in tokens.values()), default=0)
        if longest == 0:
            return state
        for slot, toks in tokens.items():
            if lengths[slot] + len(toks) >= self.max_len:
                raise ContextOverflow(
                    f"slot {slot}: {lengths[slot]} cached + {len(toks)} new tokens exceed "
                    f"the cache of {self.max_len} (one slot is kept for the final token)")
        if self.paged:
            self._take_pages({slot: (int(lengths[slot]), len(toks)) for slot, toks in tokens.items()})
        lengths = np.asarray(lengths)
        state = self._placed(params, state)
        for call in self.prefill_calls({slot: len(toks) for slot, toks in tokens.items()}, lengths):
            state = self._prefill_rows(params, state, {slot: tokens[slot] for slot in call}, lengths)
        return state

    def _prefill_rows(self, params, state: SamplerState, tokens: Mapping[int, Sequence[int]],
                      lengths: np.ndarray) -> SamplerState:
        """One prefill call of `tokens` (checked by `extend`)."""
        width, window = self._prefill_shape({slot: len(toks) for slot, toks in tokens.items()}, lengths)
        rows = list(tokens.values())
        gathered = self._prefill_batch(len(rows), width)
        for slot, toks in tokens.items():  # each row's own: other groupings of the rows need them
            own = self._prefill_shape({slot: len(toks)}, lengths)
            self.shapes_met["width"].add(own[0])
            self.shapes_met["prefill_window"].add(own[1])
        for key, n in (("calls", 1), ("rows", gathered), ("work", gathered * width * window)):
            self.prefill_counts[key] += n

        def run(state, slots, lengths):
            batch = state.logits_BV.shape[0]
            ids = np.zeros((batch, width), np.int32)
            seg = np.zeros((batch, width), np.int32)
            for slot, toks in zip(slots, rows):
                ids[slot, : len(toks)] = toks
                seg[slot, : len(toks)] = 1
            return _prefill(params, self._with_table(state), self._put(ids), self._put(seg), programs=self.programs,
                            window=window), None

        return self._on_rows(state, list(tokens), lengths, run, gathered)[0]

    def _prefill_batch(self, rows: int, width: int) -> int:
        """The batch a prefill of `rows` rows `width` wide runs at: the smallest prefill row
        bucket that holds them and, gathered, at least 2 rows and 64 tokens: XLA:CPU rounds a
        prefill of one row, or of fewer tokens (rows x width), differently from the same rows
        in a larger batch (measured with the test suite's flags), and a row's numbers must not
        depend on its batch (`tests/rollout/test_row_buckets.py`)."""
        least_rows, least_tokens = _MIN_GATHERED_PREFILL
        batch = _bucket(max(rows, 1), self.prefill_row_buckets, "a row count")
        if batch < self.batch_size:
            need = min(max(batch, least_rows, -(-least_tokens // width)), self.batch_size)
            batch = _bucket(need, self.prefill_row_buckets, "a row count")
        return batch

    def _prefill_shape(self, new: Mapping[int, int], lengths: np.ndarray) -> tuple[int, int]:
        """(width, window) of one prefill call of `new[slot]` tokens in each slot."""
        width = _bucket(max(max(new.values()), 1), self.prefill_buckets, "a prefill")
        window = self._window(max(int(lengths[slot]) + n for slot, n in new.items()), self.prefill_window_buckets)
        return width, window

    def prefill_calls(self, new: Mapping[int, int], lengths: np.ndarray) -> list[list[int]]:
        """The calls that prefill `new[slot]` tokens in each slot (held: `lengths[slot]`): one
        call, or (where a prefill gathers its rows, per_layer) the cheapest calls of rows split
        by their width bucket, each run of rows in one call or in pieces of row-bucket size
        (12 rows: 8 + 4 rather than 16). A call costs about batch x width x window (its tokens
        and their attention, per row) plus `prefill_call_cost` (dispatch, gather and write-back:
        5-15 ms on a loaded CPU), so a long first prompt no longer
        pads the short observations it is prefilled with to its width, nor 9 rows pay for 16.
        Pieces reuse the row buckets' programs: no new shapes to compile."""
        slots = sorted(new, key=lambda slot: new[slot])
        # every call on all slots: one is cheapest; the stacked layout: rows alike only unsplit
        if len(self.prefill_row_buckets) == 1 or self.layout != "per_layer" or not slots:
            return [list(new)] if new else []
        by_width: dict[int, list[int]] = {}
        for slot in slots:
            by_width.setdefault(_bucket(max(new[slot], 1), self.prefill_buckets, "a prefill"), []).append(slot)
        groups = list(by_width.values())  # in increasing width

        def cost(call: list[int]) -> int:
            width, window = self._prefill_shape({slot: new[slot] for slot in call}, lengths)
            return self._prefill_batch(len(call), width) * width * window + self.prefill_call_cost

        def cheapest(rows: list[int]) -> tuple[int, list[list[int]]]:
            """One call, or pieces of the largest row buckets that fit (rows by their window)."""
            rows = sorted(rows, key=lambda slot: int(lengths[slot]) + new[slot])
            pieces, rest = [], rows
            while rest:
                size = max([b for b in self.prefill_row_buckets if b <= len(rest)] or [len(rest)])
                pieces.append(rest[:size])
                rest = rest[size:]
            return min(((cost(rows), [rows]), (sum(map(cost, pieces)), pieces)), key=lambda x: x[0])

        # best[j]: the cheapest calls for groups[:j], each a run of neighbouring groups
        best: list[tuple[int, list[list[int]]]] = [(0, [])]
        for j in range(1, len(groups) + 1):
            best.append(min(((best[i][0] + c, best[i][1] + calls)
                             for i in range(j) for c, calls in [cheapest(sum(groups[i:j], []))]), key=lambda x: x[0]))
        return best[-1][1]

    def _take_pages(self, grow: Mapping[int, tuple[int, int]]) -> None:
        """Pages for each slot (held tokens, new tokens) to hold both, or none taken and
        ContextOverflow."""
        table = self.page_table
        short = [slot for slot, (held, new) in grow.items() if table.grow(slot, held + new) < held + new]
        if short:
            for slot, (held, _) in grow.items():
                table.shrink(slot, held)
            raise ContextOverflow(f"slots {short}: the pool of {table.pages} pages of {table.page_size} tokens has "
                                  f"{len(table.free)} free, too few for the new tokens (a larger rollout.kv_pages, "
                                  "or fewer rows)")

    def _put(self, x: np.ndarray):
        if self.mesh is None:
            return jnp.asarray(x)
        return jax.device_put(x, NamedSharding(self.mesh, self.rules.spec(("batch", "seq")[: x.ndim])))

    # ---------------------------------------------------------------- decode

    def generate(self, params, state: SamplerState, slots: Sequence[int], *, max_new_tokens: int | Sequence[int],
                 seeds: Sequence[int], lengths: np.ndarray | None = None
                 ) -> tuple[SamplerState, dict[int, Generation]]:
        """Decodes in the given slots until each emits a stop token or `max_new_tokens`
        (one for all, or one per slot, aligned with `slots`; capped by the slot's room). Other
        slots sit out. Returns the new state and each slot's Generation.

        Runs in chunks (a windowed backend): each attends over the smallest window bucket that
        holds the longest row's next token, and ends when a row fills it; the rows still going continue
        in the next window. Sampling keys depend on positions only, so chunking changes no token.
        """
        lengths = np.array(self.lengths(state) if lengths is None else lengths, np.int64)
        state = self._placed(params, state)
        budgets = [max_new_tokens] * len(slots) if np.ndim(max_new_tokens) == 0 else list(max_new_tokens)
        if len(budgets) != len(slots):
            raise ValueError(f"{len(budgets)} token budgets for {len(slots)} slots")
        state, out = self._on_rows(state, list(slots), lengths,
                                   lambda state, rows, lengths: self._generate(params, state, rows, budgets, seeds,
                                                                               lengths))
        return state, dict(zip(slots, out.values()))

    def _generate(self, params, state: SamplerState, slots: Sequence[int], budgets: Sequence[int],
                  seeds: Sequence[int], lengths: np.ndarray) -> tuple[SamplerState, dict[int, Generation]]:
        """`generate` on the rows of `state` (all slots, or a batch of gathered rows)."""
        batch = state.logits_BV.shape[0]
        lengths = np.array(lengths, np.int64)
        remaining = np.zeros(batch, np.int64)
        row_seeds = np.zeros(batch, np.uint32)
        for slot, seed, budget in zip(slots, seeds, budgets):
            remaining[slot] = max(0, min(int(budget), self.max_len - 1 - int(lengths[slot])))
            row_seeds[slot] = np.uint32(seed % 2**32)
        empty = (np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.float32))
        pieces = {slot: [empty] for slot in slots}  # (tokens, logprobs, sampling_logprobs) per chunk
        stopped = dict.fromkeys(slots, False)
        going = [slot for slot in slots if remaining[slot] > 0]
        out_of_pages = set()
        while going:
            window = self.decode_window(max(int(lengths[slot]) for slot in going) + 1)
            active = np.zeros(batch, bool)
            max_new = np.zeros(batch, np.int32)
            for slot in going:
                active[slot], max_new[slot] = True, min(remaining[slot], window - lengths[slot])
            if self.paged:
                for slot in self._grant_pages(going, lengths, max_new):  # rows with no page for their next token
                    active[slot], max_new[slot] = False, 0
                    out_of_pages.add(slot)
                going = [slot for slot in going if slot not in out_of_pages]
                if not going:
                    break
            steps = _bucket(int(max_new.max()), self.decode_buckets, "a decode")
            for slot in going:  # each row's own steps (other groupings of the rows meet them)
                self.shapes_met["decode_steps"].add(_bucket(max(int(max_new[slot]), 1), self.decode_buckets, "a decode"))
            state, out = _decode(params, self._with_table(state), jnp.asarray(row_seeds), self._put(active),
                                 self._put(max_new), programs=self.programs, steps=steps, window=window)
            toks, lp, slp, n, hit = jax.device_get(out)
            for slot in going:
                k = int(n[slot])
                pieces[slot].append((toks[slot, :k], lp[slot, :k], slp[slot, :k]))
                # every window the row's own chunk would have met, here or in any other grouping
                first, last = (self.decode_window(min(int(x) + 1, self.max_len)) for x in (lengths[slot], lengths[slot] + k))
                self.shapes_met["decode_window"].update(w for w in self.window_buckets if first <= w <= last)
                lengths[slot] += k
                remaining[slot] -= k
                stopped[slot] = bool(hit[slot])
                if self.paged:  # pages taken for tokens the row did not decode go back
                    self.page_table.shrink(slot, int(lengths[slot]))
            going = [slot for slot in going if not stopped[slot] and remaining[slot] > 0]
        self.rows_out_of_pages += len(out_of_pages)
        results = {}
        for slot in slots:
            toks, lp, slp = (np.concatenate(x) for x in zip(*pieces[slot]))
            reason = "stop" if stopped[slot] else "pages" if slot in out_of_pages else "length"
            results[slot] = Generation(tokens=toks, logprobs=lp, sampling_logprobs=slp, finish_reason=reason)
        return state, results

    def _grant_pages(self, going: Sequence[int], lengths: np.ndarray, max_new: np.ndarray) -> list[int]:
        """Pages for a decode chunk: first each row's next token (so that no row starves while
        another reserves its whole chunk), then each row's chunk as far as the pool goes,
        `max_new` cut to what a row got. Returns the rows that got no page for their next
        token."""
        table, starved = self.page_table, []
        for slot in going:
            if table.grow(slot, int(lengths[slot]) + 1) <= lengths[slot]:
                starved.append(slot)
        for slot in going:
            if slot not in starved:
                held = table.grow(slot, int(lengths[slot] + max_new[slot]))
                max_new[slot] = min(int(max_new[slot]), held - int(lengths[slot]))
        return starved
