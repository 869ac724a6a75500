"""A device check for the first accelerator: correctness against transformers, decode speed
against the memory-bandwidth limit, train-step MFU; one JSON file.

    python launch/device_check.py --out device_check.json             # on a GPU / TPU (under 8 min on one H200)
    python launch/device_check.py --quick --out /tmp/check.json       # tiny shapes: the same code on CPU

1. parity: a small random Qwen3 (transformers, on CUDA when torch has it, else CPU) against our
   forward on the default device: max |logit difference| and the gradient of the mean
   log-likelihood (largest difference relative to the largest gradient entry), f32.
2. decode: the stacked sampler (the accelerator layout) on Qwen3-0.6B-shaped random bf16
   weights at batch 16, 64 and 128, a 512-token prompt then 128 new tokens: tokens/s, and the
   ratio to the HBM limit (weights + filled KV cache read once per step at --hbm-tbps).
   decode_paged: the same with the paged KV cache (`rollout.kv_cache=paged`: the Pallas
   paged-attention kernel on TPU, the gather read elsewhere), so the two caches compare.
3. decode_fill: decode step time at batch 16 with the cache filled to 1/8, 1/2 and 1 of
   4,096 tokens, against (weights + filled KV) / bandwidth: the bytes model of
   `bench.py decode_bytes` says the ratio stays near 1 (goal: <= 1.3 at 1/8 fill).
4. train: one GRPO step of Qwen3-0.6B shapes (bf16 compute, f32 master weights) on 8 x 1,024
   tokens: seconds per step, XLA's flop count, MFU against --peak-tflops.
5. attention: forward + backward of causal self-attention at Qwen3-4B's heads (32 query heads
   on 8 kv heads of 128, bf16), 4,096 tokens x 4 rows and 16,384 x 1, per kernel: the flash
   loop, and the platform's fused kernel (cuDNN on GPU, splash on TPU; the XLA kernel on
   CPU): seconds and TFLOP/s of the causal attention's useful flops (6 H K T^2 a row).
6. rollout: `bench.py rollout --json` when that benchmark exists (its figures as printed).

The JSON file is rewritten after every part, so a run stopped by its time limit keeps what
it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxscaffold.models import config as model_configs  # noqa: E402
from jaxscaffold.models import hf_io, qwen3  # noqa: E402

H200 = {"hbm_tbps": 4.8, "peak_tflops": 989.0}  # HBM3e bandwidth; dense bf16 tensor-core peak
# In order of what a first run most needs; `--parts` picks some.
PARTS = ("parity", "decode", "decode_paged", "decode_fill", "train", "attention", "rollout")


def timed(fn, reps: int = 3) -> float:
    """The median seconds of `fn()` (which blocks until its result is ready), after a warm-up."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def parity(quick: bool) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=512) if quick else dict(
        num_hidden_layers=4, hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
        intermediate_size=1536, vocab_size=8192)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**shape, tie_word_embeddings=False, max_position_embeddings=1024)).eval()
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        config, params = hf_io.load_pretrained(d, dtype="float32", compute_dtype="float32")
    model = model.to(device)
    tokens = np.random.RandomState(0).randint(0, shape["vocab_size"], (2, 64 if quick else 256))
    ids = torch.as_tensor(tokens, device=device)
    ref_logits = model(input_ids=ids).logits
    ref_loss = -torch.log_softmax(ref_logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean()
    ref_loss.backward()
    ref_grad = model.model.layers[0].mlp.down_proj.weight.grad.detach().cpu().numpy().T  # ours is [in, out]

    def loss(p):
        logits = qwen3.forward(p, config, jnp.asarray(tokens))
        lp = jax.nn.log_softmax(logits[:, :-1], -1)
        return -jnp.mean(jnp.take_along_axis(lp, jnp.asarray(tokens)[:, 1:, None], -1))

    logits = np.asarray(jax.jit(lambda p: qwen3.forward(p, config, jnp.asarray(tokens)))(params))
    grads = jax.jit(jax.grad(loss))(params)
    ours_grad = np.asarray(grads["layers"]["down"][0])
    return {"torch_device": device, "jax_device": str(jax.devices()[0]),
            "max_abs_logit_diff": float(np.max(np.abs(logits - ref_logits.detach().cpu().numpy()))),
            "grad_rel_diff": float(np.max(np.abs(ours_grad - ref_grad)) / np.max(np.abs(ref_grad)))}


def decode(quick: bool, hbm_tbps: float, kv_cache: str = "contiguous") -> list[dict]:
    from jaxscaffold.rollout.engine import Sampler, SamplerOptions
    from jaxscaffold.rollout.sampling import GREEDY
    config = (model_configs.tiny(compute_dtype="bfloat16", param_dtype="bfloat16") if quick
              else model_configs.preset("qwen3-0.6b", compute_dtype="bfloat16", param_dtype="bfloat16"))
    params = qwen3.init_params(config, jax.random.key(0))
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    prompt, new = (32, 16) if quick else (512, 128)
    out = []
    for batch in ((2, 4) if quick else (16, 64, 128)):
        sampler = Sampler(config, batch_size=batch, max_len=prompt + new + 8, stop_ids=(),
                          options=SamplerOptions(sampling=GREEDY, cache_dtype="bfloat16", layout="stacked",
                                                 kv_cache=kv_cache))
        prepared = sampler.prepare(params)
        ids = {s: list(np.random.RandomState(s).randint(0, config.vocab_size, prompt)) for s in range(batch)}

        def run():
            state = sampler.extend(prepared, sampler.init_state(), ids)
            state, gens = sampler.generate(prepared, state, list(range(batch)), max_new_tokens=new,
                                           seeds=list(range(batch)))
            jax.block_until_ready(state.logits_BV)

        def prefill_only():
            jax.block_until_ready(sampler.extend(prepared, sampler.init_state(), ids).logits_BV)

        seconds = timed(run) - timed(prefill_only)
        kv_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2  # k and v, bf16
        mean_fill = prompt + new / 2
        step_bytes = weight_bytes + batch * mean_fill * kv_per_token
        limit = batch * hbm_tbps * 1e12 / step_bytes  # tokens/s if each step read weights + filled KV once
        rate = batch * new / seconds
        out.append({"batch": batch, "tokens_per_s": rate, "hbm_limit_tokens_per_s": limit, "of_limit": rate / limit})
    return out


def decode_fill(quick: bool, hbm_tbps: float) -> list[dict]:
    """Seconds per decode step with the cache filled to 1/8, 1/2 and all of its length."""
    from jaxscaffold.rollout.engine import Sampler, SamplerOptions
    from jaxscaffold.rollout.sampling import GREEDY
    config = (model_configs.tiny(compute_dtype="bfloat16", param_dtype="bfloat16") if quick
              else model_configs.preset("qwen3-0.6b", compute_dtype="bfloat16", param_dtype="bfloat16"))
    params = qwen3.init_params(config, jax.random.key(0))
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    kv_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2  # k and v, bf16
    batch, length, new = (2, 128, 4) if quick else (16, 4096, 16)
    sampler = Sampler(config, batch_size=batch, max_len=length + 8, stop_ids=(),
                      options=SamplerOptions(sampling=GREEDY, cache_dtype="bfloat16", layout="stacked"))
    prepared = sampler.prepare(params)
    out = []
    for fill in (1 / 8, 1 / 2, 1):
        prompt = int(length * fill) - new
        ids = {s: list(np.random.RandomState(s).randint(0, config.vocab_size, prompt)) for s in range(batch)}

        def run(steps):
            state = sampler.extend(prepared, sampler.init_state(), ids)
            if steps:
                state, _ = sampler.generate(prepared, state, list(range(batch)), max_new_tokens=steps,
                                            seeds=list(range(batch)))
            jax.block_until_ready(state.logits_BV)

        step_s = (timed(lambda: run(new)) - timed(lambda: run(0))) / new
        model_s = (weight_bytes + batch * (prompt + new / 2) * kv_per_token) / (hbm_tbps * 1e12)
        out.append({"fill": fill, "batch": batch, "tokens": prompt + new, "step_s": step_s,
                    "bytes_model_s": model_s, "over_bytes_model": step_s / model_s})
    return out


def attention_kernels(quick: bool) -> list[dict]:
    """Forward + backward of causal self-attention per kernel and length (module docstring)."""
    from jaxscaffold.models import attention
    platform = jax.default_backend()
    kernels = ["flash"] + {"gpu": ["cudnn"], "tpu": ["splash"]}.get(platform, ["xla"])
    h, g, k = (4, 2, 64) if quick else (32, 8, 128)
    cases = ((2, 256), (1, 512)) if quick else ((4, 4096), (1, 16384))
    out = []
    for rows, t in cases:
        rng = np.random.RandomState(0)
        q, dout = (jnp.asarray(rng.randn(rows, t, h, k), jnp.bfloat16) for _ in range(2))
        kv = [jnp.asarray(rng.randn(rows, t, g, k), jnp.bfloat16) for _ in range(2)]
        seg = jnp.ones((rows, t), jnp.int32)
        idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (rows, t))
        useful = 6.0 * rows * h * k * t * t  # 2 matmuls x 2 H K T^2 / 2 (causal) x 3 (forward + backward)
        for kernel in kernels:
            def loss(q, k_, v):
                o = attention.attend(kernel, q, k_, v, q_segment_BT=seg, kv_segment_BS=seg, q_index_BT=idx,
                                     kv_index_S=idx[0])
                return jnp.sum(o.astype(jnp.float32) * dout.astype(jnp.float32))

            step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            try:
                seconds = timed(lambda: jax.block_until_ready(step(q, *kv)))
            except Exception as e:  # one kernel failing (a missing cuDNN) keeps the others
                out.append({"kernel": kernel, "rows": rows, "tokens": t, "error": f"{type(e).__name__}: {e}"[:500]})
                continue
            out.append({"kernel": kernel, "rows": rows, "tokens": t, "seconds": seconds,
                        "tflops_per_s": useful / seconds / 1e12})
    return out


def rollout(quick: bool, seconds_left: float) -> list[dict] | dict:
    """`bench.py rollout --json`'s figures, when the benchmark exists."""
    import subprocess
    sys.path.insert(0, os.path.join(ROOT, "launch"))
    import bench
    if "rollout" not in bench.SUITES:
        return {"skipped": "bench.py has no rollout benchmark on this branch"}
    cmd = [sys.executable, os.path.join(ROOT, "launch", "bench.py"), "rollout", "--json"] + (["--quick"] if quick else [])
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, seconds_left))
    figures = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode:
        return {"error": f"exit {run.returncode}: {run.stderr[-500:]}", "figures": figures}
    return figures


def train(quick: bool, peak_tflops: float) -> dict:
    from jaxscaffold.rl.presets import preset
    from jaxscaffold.rl.train_step import BATCH_AXES, OptimizerConfig, init_train_state, make_train_step
    config = (model_configs.tiny(compute_dtype="bfloat16") if quick
              else model_configs.preset("qwen3-0.6b", compute_dtype="bfloat16", remat_policy="full"))
    rows, length = (2, 128) if quick else (8, 1024)
    opt = OptimizerConfig()
    step = make_train_step(config, preset("grpo"), opt)
    state = init_train_state(qwen3.init_params(config, jax.random.key(0)), opt.make())
    rng = np.random.RandomState(0)
    batch = {"tokens_BT": jnp.asarray(rng.randint(0, config.vocab_size, (rows, length)), jnp.int32),
             "segment_ids_BT": jnp.ones((rows, length), jnp.int32), "loss_mask_BT": jnp.ones((rows, length), jnp.int32),
             "old_logp_BT": jnp.full((rows, length), -5.0, jnp.float32),
             "adv_B": jnp.asarray(rng.randn(rows), jnp.float32)}
    assert set(batch) == set(BATCH_AXES)
    holder = {"state": state}

    def run():
        holder["state"], metrics = step(holder["state"], batch)
        jax.block_until_ready(metrics)

    seconds = timed(run)
    # Model flops as `bench.py train_flops` counts them: 6 N T over the layers' matmuls, the
    # unembedding on every scored position and causal attention (no embedding lookup, no remat).
    sys.path.insert(0, os.path.join(ROOT, "launch"))
    from benchmarks.train_flops import reference_flops

    flops = reference_flops(config, rows, length, length)["total"]
    return {"rows": rows, "tokens": rows * length, "seconds_per_step": seconds, "model_flops": flops,
            "mfu": flops / seconds / (peak_tflops * 1e12)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="device_check.json")
    p.add_argument("--quick", action="store_true", help="tiny shapes (a CPU dry run of the same code)")
    p.add_argument("--hbm-tbps", type=float, default=H200["hbm_tbps"])
    p.add_argument("--peak-tflops", type=float, default=H200["peak_tflops"])
    p.add_argument("--budget-s", type=float, default=450.0, help="the rollout benchmark gets what is left of it")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    args = p.parse_args(argv)
    parts = args.parts.split(",")
    if unknown := sorted(set(parts) - set(PARTS)):
        p.error(f"unknown parts {unknown} (of {', '.join(PARTS)})")
    start = time.perf_counter()
    report = {"platform": jax.default_backend(), "devices": [str(d) for d in jax.devices()], "quick": args.quick,
              "jax": jax.__version__}
    fns = {"parity": lambda: parity(args.quick), "decode": lambda: decode(args.quick, args.hbm_tbps),
           "decode_paged": lambda: decode(args.quick, args.hbm_tbps, kv_cache="paged"),
           "decode_fill": lambda: decode_fill(args.quick, args.hbm_tbps),
           "train": lambda: train(args.quick, args.peak_tflops), "attention": lambda: attention_kernels(args.quick),
           "rollout": lambda: rollout(args.quick, args.budget_s - (time.perf_counter() - start))}
    for name in parts:
        t = time.perf_counter()
        try:
            report[name] = fns[name]()
        except Exception as e:  # one failing part does not lose the others' figures
            report[name] = {"error": f"{type(e).__name__}: {e}"}
        report[f"{name}_s"] = time.perf_counter() - t
        print(f"{name}: {json.dumps(report[name])}", flush=True)
        with open(args.out, "w") as f:  # after every part: a run stopped by its time limit keeps its figures
            json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    return 1 if any("error" in report[k] for k in parts if isinstance(report[k], dict)) else 0


if __name__ == "__main__":
    sys.exit(main())
