"""Train-step throughput: our jitted GRPO step vs the same loss and AdamW update done with
transformers' PyTorch Qwen3 on the same batch; FLOP/s against a `jnp.dot` peak measured in
the same run; and the peak memory of chunked vs naive log-probabilities at vocab 151936."""

from __future__ import annotations

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import REPORT, median_time
from benchmarks.sampler import CONFIGS, _hf_model
from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.rl import logprobs as lp_lib
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_train_step


def dot_peak() -> float:
    """FLOP/s of a jitted 2048^3 f32 matmul."""
    a = jnp.ones((2048, 2048), jnp.float32)
    f = jax.jit(jnp.dot)
    return 2 * 2048**3 / median_time(lambda: f(a, a).block_until_ready(), reps=5)


def _batch(vocab, b, t, seed=0):
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, vocab, (b, t)).astype(np.int32)
    mask = np.zeros((b, t), np.int32)
    mask[:, t // 4:] = 1  # a quarter prompt, the rest response
    return {"tokens_BT": tokens, "segment_ids_BT": np.ones_like(tokens), "loss_mask_BT": mask,
            "old_logp_BT": (-rng.rand(b, t) * 5).astype(np.float32) * mask,
            "adv_B": rng.randn(b).astype(np.float32)}


def _torch_step(model, batch, lr=1e-6, clip=0.2, bf16: bool = False):
    """The GRPO seq-mean-token-mean PPO-clip loss + AdamW, in PyTorch (f32, or the forward and
    backward under bf16 autocast with f32 weights and optimizer: like our bf16 compute)."""
    import contextlib

    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    tokens = torch.as_tensor(batch["tokens_BT"]).long()
    mask = torch.as_tensor(batch["loss_mask_BT"]).float()[:, 1:]
    old = torch.as_tensor(batch["old_logp_BT"])[:, 1:]
    adv = torch.as_tensor(batch["adv_B"])[:, None]

    def step():
        opt.zero_grad(set_to_none=True)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast:
            logits = model(input_ids=tokens).logits[:, :-1].float()
        logp = torch.gather(torch.log_softmax(logits, -1), -1, tokens[:, 1:, None])[..., 0]
        ratio = torch.exp(torch.clamp(logp - old, -20, 20))
        loss_t = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip))
        loss = ((loss_t * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


def logprob_memory(b=4, t=1024, vocab=151936, chunk=128) -> tuple[float, float]:
    """Temp bytes (from XLA's memory analysis) of grad(logprobs) chunked vs full logits."""
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=32)
    params = jax.eval_shape(lambda: qwen3.init_params(cfg, jax.random.key(0)))
    h = jax.ShapeDtypeStruct((b, t, 64), jnp.float32)
    toks = jax.ShapeDtypeStruct((b, t), jnp.int32)

    def chunked(p, h, x):
        return jnp.sum(lp_lib.logprobs_from_hidden(p, cfg, h, x, chunk=chunk)[0])

    def naive(p, h, x):
        logp = jax.nn.log_softmax(qwen3.unembed(p, cfg, h)[:, :-1], -1)
        return jnp.sum(jnp.take_along_axis(logp, x[:, 1:, None], -1))

    sizes = []
    for f in (chunked, naive):
        compiled = jax.jit(jax.grad(f, argnums=(0, 1))).lower(params, h, toks).compile()
        sizes.append(compiled.memory_analysis().temp_size_in_bytes)
    return tuple(sizes)


def run(quick: bool = False) -> None:
    import torch
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    b, t = (4, 128) if quick else (8, 256)
    name = "tiny" if quick else "100m"
    reps = 2 if quick else 3
    REPORT.say(f"# train step: {name} config, batch {b} x {t} tokens, GRPO loss + AdamW; torch threads {cores}")
    peak = dot_peak()
    REPORT.figure("jnp.dot 2048^3 f32 peak", peak / 1e9, "GFLOP/s")
    directory = tempfile.mkdtemp(prefix=f"bench-train-{name}-")
    model = _hf_model(name, directory).train()
    batch = _batch(CONFIGS[name]["vocab_size"], b, t)
    tokens = b * t
    # Steady state: the first two steps of either framework are slower (allocation warm-up).
    warmup = 1 if quick else 2
    for compute in ("float32", "bfloat16"):
        config, params = hf_io.load_pretrained(directory, compute_dtype=compute)  # f32 master weights
        opt = OptimizerConfig(lr=1e-6).make()
        step = make_train_step(config, preset("grpo"), opt, logprob_chunk=128)
        state = [init_train_state(params, opt)]

        def ours():
            state[0], metrics = step(state[0], batch)
            jax.block_until_ready(metrics)

        t_ours = median_time(ours, reps, warmup=warmup)
        t_torch = median_time(_torch_step(model, batch, bf16=compute == "bfloat16"), reps, warmup=warmup)
        del state
        n_params = config.num_params()
        attn = config.num_layers * 2 * b * t * t * config.q_dim  # QK^T and PV, causal half counted fully
        flops = 6 * n_params * tokens + 3 * 2 * attn
        ref = "PyTorch" if compute == "float32" else "PyTorch bf16 autocast"
        REPORT.figure(f"train step tokens/s, {compute} compute, ours vs {ref}", tokens / t_ours, "tok/s",
                      t_torch / t_ours)
        REPORT.figure(f"train step achieved FLOP/s / jnp.dot f32 peak, {compute} compute",
                      flops / t_ours / peak, "fraction", note=f"({flops / t_ours / 1e9:.0f} GFLOP/s)")
    chunked, naive = logprob_memory()
    REPORT.figure("logprob grad temp memory at vocab 151936, chunked", chunked / 2**20, "MiB", chunked / naive,
                  note=f"(naive full logits: {naive / 2**20:.0f} MiB)")
