"""One process of the per-host rollout mesh test (run by test_multihost_rollout.py): 8 devices
in all (8 / n a process), the parameters sharded over a data=1 x fsdp=2 x tensor=4 training
mesh; each process samples its share of the prompts on `sampler_params`'s parameters."""

import json
import os

import numpy as np

from tests.train.multihost_setup import configure  # noqa: E402

process_id, num_processes, out = configure(total_devices=8)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxscaffold.models import lora as lora_lib  # noqa: E402
from jaxscaffold.models import qwen3  # noqa: E402
from jaxscaffold.models.config import Qwen3Config  # noqa: E402
from jaxscaffold.models.local_mesh import device_bytes  # noqa: E402
from jaxscaffold.models.sharding import MeshConfig, make_mesh, maybe_initialize_distributed  # noqa: E402
from jaxscaffold.rollout.engine import Sampler, SamplerOptions  # noqa: E402
from jaxscaffold.rollout.sampling import SamplingConfig  # noqa: E402
from jaxscaffold.train.multihost import process_share, rollout_mesh, sampler_params  # noqa: E402

assert maybe_initialize_distributed() == (num_processes > 1)
assert jax.device_count() == 8 and jax.process_count() == num_processes
mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=4))
PROMPTS, ROWS, NEW = 8, 4, 12


def param_bytes(config) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(qwen3.param_shapes(config)))


def sample(config, params, sampler):
    """Tokens and log-probs of this process's share of the prompts (T = 1, per-prompt seeds),
    in batches of ROWS slots."""
    rng = np.random.RandomState(1)
    prompts = [rng.randint(0, config.vocab_size, 3 + i % 4).tolist() for i in range(PROMPTS)]
    prepared = sampler.prepare(params)
    mine, out = list(process_share(PROMPTS)), {}
    for start in range(0, len(mine), ROWS):
        chunk = mine[start:start + ROWS]
        state = sampler.extend(prepared, sampler.init_state(), {s: prompts[i] for s, i in enumerate(chunk)})
        state, gens = sampler.generate(prepared, state, range(len(chunk)), max_new_tokens=NEW,
                                       seeds=[1000 + i for i in chunk])
        out.update({i: (gens[s].tokens.tolist(), gens[s].logprobs.tolist()) for s, i in enumerate(chunk)})
    return out, prepared


def largest_share(tree, total: int) -> float:
    """The most bytes any local device holds of `tree`, over the model's parameter bytes."""
    return max(device_bytes(tree).values()) / total


def total_bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


result = {}
# Tokens: kv heads divide the 4 devices of a host, so the cache is sharded too.
config = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=4, head_dim=16)
params = qwen3.init_params(config, jax.random.key(0), mesh=mesh)
sampler_mesh, rules = rollout_mesh(config)
for layout in ("per_layer", "stacked"):  # the CPU's and the TPU / GPU one
    sampler = Sampler(config, stop_ids=(), batch_size=ROWS, max_len=64, mesh=sampler_mesh, rules=rules,
                      options=SamplerOptions(sampling=SamplingConfig(temperature=1.0), layout=layout))
    # No host <-> device transfer in the reshard: it is device to device. (On CPU reading a
    # device buffer from the host is not a copy, and the device-to-host guard misses it; the
    # host-to-device one is what any detour through host memory back onto a device trips.)
    with jax.transfer_guard_host_to_device("disallow_explicit"), jax.transfer_guard_device_to_host("disallow_explicit"):
        local = jax.block_until_ready(sampler_params(params, sampler))
    tokens, prepared = sample(config, local, sampler)
    state = sampler.init_state()
    result[layout] = {
        "tokens": tokens, "share": largest_share(local, param_bytes(config)),
        "prepared_share": largest_share(prepared, total_bytes(prepared)),  # the CPU layout's copy, split alike
        "cache_share": largest_share(state.cache, total_bytes(state.cache)),
        "devices": sorted({d.id for x in jax.tree.leaves(local) for d in x.sharding.device_set})}
    if num_processes == 1:  # an independent reference: the whole model on one device, unsharded sampler
        one = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), params)
        plain = Sampler(config, stop_ids=(), batch_size=ROWS, max_len=64,
                        options=SamplerOptions(sampling=SamplingConfig(temperature=1.0), layout=layout))
        result[layout]["tokens_one_device"], _ = sample(config, one, plain)
result["local_devices"] = sorted(d.id for d in jax.local_devices())

# LoRA: the samplers decode with the base merged with the adapters (B made non-zero, so the
# merge changes the model), merged on the training mesh and then resharded the same way.
lora = lora_lib.LoraConfig(rank=4, alpha=8.0)
adapters = lora_lib.init_adapters(config, lora, jax.random.key(3), mesh=mesh)
adapters = jax.tree.map(lambda x: x + 0.05, adapters)
merged = lora_lib.merged(config, params, adapters, lora)
sampler = Sampler(config, stop_ids=(), batch_size=ROWS, max_len=64, mesh=sampler_mesh, rules=rules,
                  options=SamplerOptions(sampling=SamplingConfig(temperature=1.0)))
local = sampler_params(merged, sampler)
tokens, _ = sample(config, local, sampler)
result["lora"] = {"tokens": tokens, "share": largest_share(local, param_bytes(config))}

if num_processes > 1:
    # Host memory around the reshard, with a model of ~86 MB (f32). On CPU the devices' buffers
    # are host memory too, so the reshard's own result (this process's 4 shards: the model once)
    # is subtracted; what is left is what a host copy would add. The peak (VmHWM, reset first)
    # catches a copy freed before the call returns. The old path (process_allgather) is
    # measured the same way as the control: it must show the model's size.
    from jax.experimental import multihost_utils

    def rss_peak_after(fn):
        """fn()'s value and the peak RSS above the RSS before the call."""
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        before = _status("VmRSS")
        value = jax.block_until_ready(fn())
        return value, _status("VmHWM") - before

    def _status(field: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

    big = Qwen3Config(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8,
                      num_kv_heads=8, head_dim=64)
    big_params = qwen3.init_params(big, jax.random.key(1), mesh=mesh)
    big_mesh, big_rules = rollout_mesh(big)
    big_sampler = Sampler(big, stop_ids=(), batch_size=ROWS, max_len=64, mesh=big_mesh, rules=big_rules)
    # Compiled once, unmeasured; kept alive, so the measured reshard's buffers are new memory.
    warm = jax.block_until_ready(sampler_params(qwen3.init_params(big, jax.random.key(2), mesh=mesh), big_sampler))
    with jax.transfer_guard_host_to_device("disallow_explicit"):
        resharded, grown = rss_peak_after(lambda: sampler_params(big_params, big_sampler))
    _, grown_gather = rss_peak_after(lambda: multihost_utils.process_allgather(big_params, tiled=True))
    try:  # the guard catches the old path: a host copy put back on a device
        with jax.transfer_guard_host_to_device("disallow_explicit"):
            jnp.asarray(multihost_utils.process_allgather(big_params["embed"], tiled=True))
        guard_caught_gather = False
    except Exception:  # noqa: BLE001 (jax raises a runtime error)
        guard_caught_gather = True
    result["memory"] = {"model_bytes": param_bytes(big), "reshard_peak_growth": grown,
                        "reshard_held": sum(device_bytes(resharded).values()),
                        "gather_peak_growth": grown_gather, "guard_caught_gather": guard_caught_gather,
                        "share": largest_share(resharded, param_bytes(big))}
    np.testing.assert_array_equal(np.asarray(resharded["embed"]),
                                  np.asarray(multihost_utils.process_allgather(big_params["embed"], tiled=True)))
    del warm

with open(os.path.join(out, f"process{process_id}.json"), "w") as f:
    json.dump(result, f)
