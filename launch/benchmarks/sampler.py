"""Sampler throughput: our JAX sampler vs transformers `generate` (PyTorch CPU) on the same
weights, plus the fraction of the memory-bandwidth limit and the multi-turn cache win. Ours and
theirs, f32 and bf16, are timed in interleaved rounds (`interleaved_medians`)."""

from __future__ import annotations

import copy
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import REPORT, interleaved_medians, median_time
from jaxscaffold.models import hf_io
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig

CONFIGS = {
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, intermediate_size=384, vocab_size=4096),
    "100m": dict(num_hidden_layers=8, hidden_size=768, num_attention_heads=12, num_key_value_heads=4,
                 head_dim=64, intermediate_size=2048, vocab_size=32000),
}
BATCH, PROMPT, NEW = 8, 64, 128


def _hf_model(name: str, directory: str):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen3Config(**CONFIGS[name], tie_word_embeddings=True, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(directory)
    return model


def _torch_generate(model, prompt: np.ndarray, new: int, greedy: bool):
    import torch
    ids = torch.as_tensor(prompt)
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=not greedy, temperature=None if greedy else 1.0, top_p=None, top_k=None,
                       use_cache=True, eos_token_id=None, pad_token_id=0)


def memory_bandwidth() -> float:
    """Bytes/s of a jitted full read (sum) of a 512 MB array."""
    x = jnp.ones((128 * 2**20,), jnp.float32)
    f = jax.jit(jnp.sum)
    t = median_time(lambda: f(x).block_until_ready(), reps=5)
    return x.nbytes / t


def _ours(directory: str, dtype: str, sampling, prompt: np.ndarray):
    """Our prefill and decode as timed closures (decode reports its own time, after a prefill)."""
    config, params = hf_io.load_pretrained(directory, dtype=dtype, compute_dtype=dtype)
    sampler = Sampler(config, batch_size=BATCH, max_len=256, stop_ids=(),
                      options=SamplerOptions(sampling=sampling, cache_dtype=dtype, prefill_buckets=(PROMPT, 255),
                                             decode_buckets=(NEW,)))
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))  # read once per step (tied: once)
    params = sampler.prepare(params)
    tokens = {b: list(prompt[b]) for b in range(BATCH)}

    def prefill():
        state = sampler.extend(params, sampler.init_state(), tokens, lengths=np.zeros(BATCH, np.int32))
        jax.block_until_ready(state)
        return state

    def decode():
        state = prefill()
        t = time.perf_counter()
        sampler.generate(params, state, list(range(BATCH)), max_new_tokens=NEW, seeds=list(range(BATCH)),
                         lengths=np.full(BATCH, PROMPT, np.int32))
        return time.perf_counter() - t

    def time_prefill():
        prefill()  # its wall time counts

    return time_prefill, decode, weight_bytes, config


def _multi_turn(directory: str, reps: int):
    """10 turns of 32 env tokens + 32 generated: cache reuse vs re-prefilling the history."""
    config, params = hf_io.load_pretrained(directory, dtype="float32")
    turns, env, gen = 10, 32, 32
    sampler = Sampler(config, batch_size=BATCH, max_len=1024, stop_ids=(),
                      options=SamplerOptions(sampling=SamplingConfig(1.0), cache_dtype="float32",
                                             prefill_buckets=(32, 64, 128, 256, 512, 1023), decode_buckets=(gen,)))
    params = sampler.prepare(params)
    rng = np.random.RandomState(0)
    env_tokens = [[list(rng.randint(0, config.vocab_size, env)) for _ in range(BATCH)] for _ in range(turns)]
    slots = list(range(BATCH))

    def reuse():
        state, history = sampler.init_state(), np.zeros(BATCH, np.int32)
        for t in range(turns):
            state = sampler.extend(params, state, dict(enumerate(env_tokens[t])), lengths=history)
            history = history + env
            state, _ = sampler.generate(params, state, slots, max_new_tokens=gen, seeds=slots, lengths=history)
            history = history + gen
        jax.block_until_ready(state)

    def recompute():
        seqs = [[] for _ in range(BATCH)]
        for t in range(turns):
            for b in range(BATCH):
                seqs[b] = seqs[b] + env_tokens[t][b]
            state = sampler.extend(params, sampler.init_state(), dict(enumerate(seqs)),
                                   lengths=np.zeros(BATCH, np.int32))
            lengths = np.full(BATCH, len(seqs[0]), np.int32)
            state, out = sampler.generate(params, state, slots, max_new_tokens=gen, seeds=slots, lengths=lengths)
            for b in range(BATCH):
                seqs[b] = seqs[b] + list(out[b].tokens)
        jax.block_until_ready(state)

    # Interleaved rounds after a compiling warm-up: a slow spell of the machine costs both alike.
    t = interleaved_medians({"reuse": reuse, "recompute": recompute}, max(1, reps - 1))
    return t["reuse"], t["recompute"]


def run(quick: bool = False) -> None:
    import torch
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    reps = 2 if quick else 3
    REPORT.say(f"# sampler: batch {BATCH}, prompt {PROMPT}, {NEW} new tokens; torch threads {cores}; "
               f"jax {jax.__version__} on {jax.default_backend()}")
    bandwidth = memory_bandwidth()
    REPORT.figure("memory read bandwidth (jnp.sum of 512 MB)", bandwidth / 1e9, "GB/s")
    rng = np.random.RandomState(0)
    for name in (["tiny"] if quick else ["tiny", "100m"]):
        directory = tempfile.mkdtemp(prefix=f"bench-{name}-")
        models = {"float32": _hf_model(name, directory)}
        models["bfloat16"] = copy.deepcopy(models["float32"]).to(torch.bfloat16)
        prompt = rng.randint(0, CONFIGS[name]["vocab_size"], (BATCH, PROMPT))
        for mode, greedy in (("greedy", True), ("T=1", False)):
            sampling = GREEDY if greedy else SamplingConfig(temperature=1.0)
            # Every timed closure of this config and mode runs once per round, in turn.
            fns, facts = {}, {}
            for dtype in ("float32", "bfloat16"):
                model = models[dtype]
                fns[f"theirs 1 {dtype}"] = lambda m=model: _torch_generate(m, prompt, 1, greedy)
                fns[f"theirs all {dtype}"] = lambda m=model: _torch_generate(m, prompt, NEW, greedy)
                fns[f"ours prefill {dtype}"], fns[f"ours decode {dtype}"], *facts[dtype] = _ours(
                    directory, dtype, sampling, prompt)
            t = interleaved_medians(fns, reps)
            for dtype in ("float32", "bfloat16"):
                wbytes, cfg = facts[dtype]
                dec, pre = BATCH * NEW / t[f"ours decode {dtype}"], BATCH * PROMPT / t[f"ours prefill {dtype}"]
                ref_dec = {d: BATCH * (NEW - 1) / max(t[f"theirs all {d}"] - t[f"theirs 1 {d}"], 1e-9)
                           for d in ("float32", "bfloat16")}
                ref_pre_same = BATCH * PROMPT / t[f"theirs 1 {dtype}"]
                tag = f"{name} {mode} {dtype}"
                REPORT.figure(f"decode tokens/s, ours vs transformers {dtype}, {tag}", dec, "tok/s", dec / ref_dec[dtype])
                if dtype == "bfloat16":
                    REPORT.figure(f"decode tokens/s, ours vs transformers float32, {tag}", dec, "tok/s",
                                  dec / ref_dec["float32"])
                REPORT.figure(f"prefill tokens/s, ours vs transformers {dtype} (generate 1), {tag}", pre, "tok/s",
                              pre / ref_pre_same)
                item = 4 if dtype == "float32" else 2
                cache_bytes = 2 * cfg.num_layers * BATCH * (PROMPT + NEW // 2) * cfg.kv_dim * item
                step = t[f"ours decode {dtype}"] / NEW
                REPORT.figure(f"decode step: fraction of the memory-bandwidth limit, {tag}",
                              (wbytes + cache_bytes) / step / bandwidth, "fraction")
    t_reuse, t_recompute = _multi_turn(directory, reps)
    REPORT.figure("multi-turn 10x(32 env + 32 gen), cache reuse / recompute", t_reuse / t_recompute, "fraction",
                  note=f"({t_reuse:.2f}s vs {t_recompute:.2f}s)")
