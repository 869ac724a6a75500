"""The streaming export's peak host memory, in a process of its own (tests/train/test_export.py;
the 8B-shaped measurement in the issue's note runs it by hand):

  python -m tests.train.export_memory_worker make RUN --hidden 1024 --intermediate 3072 --layers 36 \
      --heads 8 --kv_heads 2 --head_dim 128 [--chunk_mb 64] [--lora_rank 16]
  python -m tests.train.export_memory_worker export RUN OUT --shard_mb 512

`make` saves a run's checkpoint as the trainer does (parameters of random weights with Adam
moments, the run config; the model's config.json as its `model.hf_path`), Qwen3's vocabulary,
untied; with --lora_rank, the base is written as that HF checkpoint and the state holds
random adapters (the export merges them, streaming the base). `export` loads the libraries and starts JAX's backend (the baseline), then resets the
kernel's peak-RSS mark and exports RUN without verification (everything the export itself
allocates counts: Orbax's manager, TensorStore, the pieces); it prints JSON: the peak RSS above the baseline (VmHWM after
/proc/self/clear_refs; where that is not writable, RSS sampled every millisecond) and the
largest safetensors file written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time


def make(args) -> None:
    import jax
    import numpy as np

    from jaxscaffold import config as config_lib
    from jaxscaffold.models import hf_io, qwen3
    from jaxscaffold.models import lora as lora_lib
    from jaxscaffold.models.config import Qwen3Config
    from jaxscaffold.rl.train_step import init_train_state
    from jaxscaffold.train.checkpoint import Checkpointer
    from jaxscaffold.train.job import lora_config, model_config, optimizer_config
    from tests.train.configs import tiny_config

    config = Qwen3Config(vocab_size=151936, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
                         head_dim=args.head_dim, tie_word_embeddings=False)
    run = args.run
    cfg = tiny_config(run)
    if args.lora_rank:
        cfg.lora.rank, cfg.lora.alpha = args.lora_rank, 2.0 * args.lora_rank
    # The architecture as an HF config.json (full fine-tuning needs no weights there).
    os.makedirs(os.path.join(run, "model"), exist_ok=True)
    with open(os.path.join(run, "model", "config.json"), "w") as f:
        json.dump(hf_io.config_to_hf(config, "float32"), f)
    cfg.model.hf_path = os.path.join(run, "model")
    typed = config_lib.typed(cfg)
    mc = model_config(typed)
    # Random values from NumPy: an export copies whatever it is given, and jax.random under the
    # tests' -O0 XLA flags spent ~8 CPU-s on these 84M parameters (NumPy: ~1.7 s).
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: jax.device_put(0.02 * rng.standard_normal(s.shape, np.float32).astype(s.dtype, copy=False)),
                          qwen3.param_shapes(mc))
    if args.lora_rank:  # the base as the run's HF checkpoint (lora.base_dtype); the state: random adapters
        hf_io.save_pretrained(cfg.model.hf_path, mc, params)
        lora = lora_config(typed.lora)
        params = lora_lib.init_adapters(mc, lora, jax.random.key(1), dtype=typed.model.param_dtype)
        params = {t: {"a": v["a"], "b": jax.random.normal(jax.random.key(2), v["b"].shape, v["b"].dtype) * 0.01}
                  for t, v in params.items()}  # b != 0: the merge changes every target
    opt = optimizer_config(typed).make()
    abstract = jax.eval_shape(lambda: init_train_state(params, opt))
    by_tail = {tuple(k.key for k in p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}

    def leaf(path, s):  # the moments share the parameters' buffers: a full-size state in 1x memory
        keys = tuple(getattr(k, "key", None) for k in path)
        for n in range(len(keys)):
            if keys[n:] in by_tail and by_tail[keys[n:]].shape == s.shape:
                return by_tail[keys[n:]]
        return np.zeros(s.shape, s.dtype)

    state = jax.tree_util.tree_map_with_path(leaf, abstract)
    ckpt = Checkpointer(os.path.join(run, "checkpoints"), async_save=False, chunk_bytes=args.chunk_mb * 2**20)
    ckpt.save(1, state, {"step": 1, "config": typed.to_dict()})
    ckpt.close()
    n = sum(x.size for x in jax.tree.leaves(params))
    print(json.dumps({"run": run, "params": int(n), "param_bytes": int(n * 4)}))


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))


def export(args) -> None:
    import jax
    import orbax.checkpoint  # noqa: F401  the libraries loaded and JAX's backend started: the baseline
    import tensorstore  # noqa: F401

    from jaxscaffold.train.export import export_checkpoint
    jax.devices()
    import gc
    gc.collect()
    time.sleep(0.5)
    baseline = _rss_kb()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        sampled = None
    except OSError:
        sampled = [baseline]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                sampled[0] = max(sampled[0], _rss_kb())
                time.sleep(0.001)
        threading.Thread(target=sample, daemon=True).start()
    t = time.perf_counter()
    export_checkpoint(args.run, args.out, verify=False, max_shard_bytes=args.shard_mb * 2**20)
    seconds = time.perf_counter() - t
    if sampled is None:
        peak, how = _hwm_kb(), "VmHWM"
    else:
        stop.set()
        peak, how = sampled[0], "sampled"
    files = [f for f in os.listdir(args.out) if f.endswith(".safetensors")]
    print(json.dumps({"baseline_bytes": baseline * 1024, "peak_above_baseline_bytes": (peak - baseline) * 1024,
                      "how": how, "largest_file_bytes": max(os.path.getsize(os.path.join(args.out, f)) for f in files),
                      "files": len(files), "max_shard_bytes": args.shard_mb * 2**20, "seconds": seconds}))


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("run")
    for name, default in (("hidden", 256), ("intermediate", 768), ("layers", 8), ("heads", 4), ("kv_heads", 1),
                          ("head_dim", 64), ("chunk_mb", 64), ("lora_rank", 0)):
        m.add_argument(f"--{name}", type=int, default=default)
    e = sub.add_parser("export")
    e.add_argument("run")
    e.add_argument("out")
    e.add_argument("--shard_mb", type=int, default=5 * 1024)
    args = p.parse_args()
    make(args) if args.cmd == "make" else export(args)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main()
