"""One process of the multi-host train-step test (run by test_multihost.py), for each variant
in turn: full fine-tuning (2 steps) and LoRA (3 steps: the base and the adapters sharded over
fsdp x tensor), each process feeding its half of the batch. Process 0 writes `{out}_{variant}`
.npz (the gathered parameters; LoRA: the adapters and the merged parameters) and .json (the
losses)."""

import json

import numpy as np

from tests.train.multihost_setup import configure  # noqa: E402

process_id, num_processes, out = configure(total_devices=4)
import jax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from jaxscaffold.models import lora as lora_lib  # noqa: E402
from jaxscaffold.models import qwen3  # noqa: E402
from jaxscaffold.models.config import Qwen3Config  # noqa: E402
from jaxscaffold.models.sharding import MeshConfig, make_mesh, maybe_initialize_distributed, shard_batch  # noqa: E402
from jaxscaffold.rl.presets import preset  # noqa: E402
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_train_step, state_shardings  # noqa: E402

assert maybe_initialize_distributed() == (num_processes > 1)
assert jax.device_count() == 4 and jax.process_count() == num_processes
config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8)
mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=2))
opt = OptimizerConfig(lr=1e-2).make()

rng = np.random.RandomState(0)  # the same global batch everywhere; each process feeds its rows
b, t = 8, 10
tokens = rng.randint(0, 64, (b, t)).astype(np.int32)
mask = np.zeros((b, t), np.int32)
mask[:, 4:] = 1
batch = {"tokens_BT": tokens, "segment_ids_BT": np.ones_like(tokens), "loss_mask_BT": mask,
         "old_logp_BT": (-rng.rand(b, t) * 3 * mask).astype(np.float32), "adv_B": rng.randn(b).astype(np.float32)}
rows = slice(process_id * b // num_processes, (process_id + 1) * b // num_processes)
gather = lambda tree: jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)  # noqa: E731
flat = lambda prefix, tree: {prefix + jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}  # noqa: E731


def save(variant: str, arrays: dict, losses: list) -> None:
    if process_id == 0:
        np.savez(f"{out}_{variant}", **arrays)
        with open(f"{out}_{variant}.json", "w") as f:
            json.dump(losses, f)


def full() -> None:
    step = make_train_step(config, preset("grpo"), opt, num_micro_batches=2, mesh=mesh)
    sh = state_shardings(config, opt, mesh)
    state = jax.jit(lambda: init_train_state(qwen3.init_params(config, jax.random.key(0)), opt), out_shardings=sh)()
    losses = []
    for _ in range(2):
        state, metrics = step(state, shard_batch({k: v[rows] for k, v in batch.items()}, mesh))
        losses.append(float(metrics["loss"]))
    save("full", flat("", gather(state.params)), losses)


def lora() -> None:
    lora = lora_lib.LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    step = make_train_step(config, preset("grpo"), opt, num_micro_batches=2, mesh=mesh, lora=lora)
    base = qwen3.init_params(config, jax.random.key(0), mesh=mesh)
    adapters = lora_lib.init_adapters(config, lora, jax.random.key(1), mesh=mesh)
    state = jax.jit(lambda a: init_train_state(a, opt), out_shardings=state_shardings(config, opt, mesh, lora=lora))(adapters)
    losses = []
    for _ in range(3):  # b is zero at the first step: the later ones train a as well
        state, metrics = step(state, shard_batch({k: v[rows] for k, v in batch.items()}, mesh), base)
        losses.append(float(metrics["loss"]))
    params, merged = gather(state.params), gather(lora_lib.merged(config, base, state.params, lora))
    save("lora", flat("adapters", params) | flat("merged", merged), losses)


full()
lora()
