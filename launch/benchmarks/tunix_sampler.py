"""Sampler throughput: our JAX sampler vs tunix's JAX sampler (google-tunix 0.1.7) on the same
Qwen3 shapes (`benchmarks.sampler.CONFIGS`), float32, random weights (throughput only).

tunix's Qwen3 is `tunix.models.qwen3.model.Qwen3(ModelConfig, rngs=nnx.Rngs)` (Flax NNX) and its
sampler is `tunix.generate.sampler.Sampler(model, tokenizer, CacheConfig)`, called as
`sampler(strings, max_generation_steps=..., max_prompt_length=..., temperature=..., top_p=..., ...)`.
It takes strings, so a stand-in tokenizer maps "12 345 ..." to ids and back.

Only tunix's model and sampler modules are imported: `tunix/__init__.py` imports the whole RL stack
(metrax, qwix, tensorflow_datasets, ...), which is skipped by registering a bare `tunix` package.
Needs `pip install --no-deps google-tunix==0.1.7 jaxtyping wadler-lindig sentencepiece`.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
import types

import numpy as np

from benchmarks.common import REPORT, median_time

INSTALL = "pip install --no-deps google-tunix==0.1.7 jaxtyping wadler-lindig sentencepiece"
CACHE_SIZE = 256  # same as our Sampler's max_len in benchmarks.sampler._ours


def _import_tunix():
    """(qwen3 model module, sampler module), or a string saying why google-tunix is not importable."""
    if "tunix" not in sys.modules:
        spec = importlib.util.find_spec("tunix")
        if spec is None or not spec.submodule_search_locations:
            return "not installed"
        package = types.ModuleType("tunix")  # skip tunix/__init__.py and its heavy imports
        package.__path__ = list(spec.submodule_search_locations)
        package.__version__ = "0.1.7"
        sys.modules["tunix"] = package
    try:
        from tunix.generate import sampler as tunix_sampler
        from tunix.models.qwen3 import model as tunix_qwen3
    except Exception as e:  # noqa: BLE001 - a missing dependency or an incompatible jax/flax
        return f"not importable: {e}"
    return tunix_qwen3, tunix_sampler


class _IdTokenizer:
    """Stand-in tokenizer: text is space-separated token ids. 0 is padding, no BOS, no EOS."""

    def encode(self, text: str, **kwargs) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **kwargs) -> str:
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return None

    def eos_id(self) -> int:
        return -1

    def pad_id(self) -> int:
        return 0


def _tunix_model(tunix_qwen3, name: str, seed: int = 0):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from benchmarks.sampler import CONFIGS
    c = CONFIGS[name]
    config = tunix_qwen3.ModelConfig(
        num_layers=c["num_hidden_layers"], vocab_size=c["vocab_size"], embed_dim=c["hidden_size"],
        hidden_dim=c["intermediate_size"], num_heads=c["num_attention_heads"], head_dim=c["head_dim"],
        num_kv_heads=c["num_key_value_heads"], rope_theta=10_000, norm_eps=1e-6,  # transformers' defaults
        use_tied_embedding=True, dtype=jnp.float32, param_dtype=jnp.float32)
    model = tunix_qwen3.Qwen3(config, rngs=nnx.Rngs(seed))
    # tunix initialises the MLP to zeros: give every matrix random values (norm scales stay 1).
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    leaves = [0.02 * jax.random.normal(k, x.shape, x.dtype) if x.ndim >= 2 else x for k, x in zip(keys, leaves)]
    nnx.update(model, jax.tree.unflatten(treedef, leaves))
    return model, config


def _tunix_decode(tunix_sampler, model, config, prompt: np.ndarray, greedy: bool, reps: int):
    """(time of generate 1, time of generate NEW minus generate 1, compilations of the decode loop)."""
    import jax

    from benchmarks.sampler import NEW, PROMPT
    cache = tunix_sampler.CacheConfig(cache_size=CACHE_SIZE, num_layers=config.num_layers,
                                      num_kv_heads=config.num_kv_heads, head_dim=config.head_dim)
    sampler = tunix_sampler.Sampler(model, _IdTokenizer(), cache)
    strings = [" ".join(str(int(t)) for t in row) for row in prompt]
    sampling = dict(temperature=0.0) if greedy else dict(temperature=1.0, top_p=1.0, top_k=None)

    def generate(new: int):
        out = sampler(strings, max_generation_steps=new, max_prompt_length=PROMPT, echo=False,
                      eos_tokens=[-1], seed=0, **sampling)
        jax.block_until_ready(out.tokens)
        assert all(len(t) == new for t in out.tokens), [len(t) for t in out.tokens]

    t_one = median_time(lambda: generate(1), reps)  # warm-up = compile (the token buffer's shape has NEW in it)
    t_all = median_time(lambda: generate(NEW), reps)
    compiles = sampler._compiled_decode_fn._cache_size() if hasattr(sampler._compiled_decode_fn, "_cache_size") else -1
    return t_one, max(t_all - t_one, 1e-9), compiles


def run(quick: bool = False) -> None:
    modules = _import_tunix()
    if isinstance(modules, str):
        print(f"google-tunix {modules}; skipping the tunix benchmark. Install with: {INSTALL}", flush=True)
        return
    tunix_qwen3, tunix_sampler = modules

    import jax

    from benchmarks.sampler import BATCH, CONFIGS, NEW, PROMPT, _hf_model, _ours
    from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig

    reps = 2 if quick else 3
    REPORT.say(f"# tunix sampler: batch {BATCH}, prompt {PROMPT}, {NEW} new tokens, float32, cache {CACHE_SIZE}; "
               f"jax {jax.__version__} on {jax.default_backend()}")
    rng = np.random.RandomState(0)
    for name in (["tiny"] if quick else ["tiny", "100m"]):
        directory = tempfile.mkdtemp(prefix=f"bench-tunix-{name}-")
        _hf_model(name, directory)
        model, config = _tunix_model(tunix_qwen3, name)
        prompt = rng.randint(1, CONFIGS[name]["vocab_size"], (BATCH, PROMPT))  # 0 is tunix's padding id
        for mode, greedy in (("greedy", True), ("T=1", False)):
            t_one, td, compiles = _tunix_decode(tunix_sampler, model, config, prompt, greedy, reps)
            tunix_dec = BATCH * (NEW - 1) / td  # generate NEW minus generate 1 = NEW - 1 decode steps
            REPORT.figure(f"decode tokens/s, tunix float32, {name} {mode}", tunix_dec, "tok/s",
                          note=f"(generate 1: {t_one * 1e3:.0f} ms; decode-loop compilations {compiles})")
            sampling = GREEDY if greedy else SamplingConfig(temperature=1.0)
            _, td_ours, _, _ = _ours(directory, "float32", sampling, prompt, reps)
            ours_dec = BATCH * NEW / td_ours
            REPORT.figure(f"decode tokens/s, ours vs tunix float32, {name} {mode}", ours_dec, "tok/s",
                          ours_dec / tunix_dec)
        shutil.rmtree(directory, ignore_errors=True)
