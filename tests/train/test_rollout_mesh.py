"""One process of 8 (fake) devices samples on its own mesh, as each of several processes
does: the weights tensor parallel and the KV cache split over kv heads, ~1/8 per device,
with the tokens of the whole model on one device and an unsharded sampler."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.local_mesh import device_bytes
from jaxscaffold.models.sharding import MeshConfig, make_mesh
from jaxscaffold.rollout.engine import Sampler, SamplerOptions, SamplingConfig
from jaxscaffold.train.multihost import rollout_mesh, sampler_params

CONFIG = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                     num_kv_heads=8, head_dim=16)


def _tokens(sampler, params, prompts):
    prepared = sampler.prepare(params)
    state = sampler.extend(prepared, sampler.init_state(), dict(enumerate(prompts)))
    _, gens = sampler.generate(prepared, state, range(len(prompts)), max_new_tokens=10,
                               seeds=[100 + i for i in range(len(prompts))])
    return [gens[s].tokens.tolist() for s in range(len(prompts))]


@pytest.mark.parametrize("layout", ["stacked", "per_layer"])
def test_one_process_samples_on_its_devices_with_an_eighth_of_weights_and_cache(layout):
    assert jax.process_count() == 1 and jax.local_device_count() == 8
    mesh, rules = rollout_mesh(CONFIG)
    assert mesh is not None and mesh.shape["tensor"] == 8
    params = qwen3.init_params(CONFIG, jax.random.key(0), mesh=make_mesh(MeshConfig(data=2, fsdp=4, tensor=1)))
    sampler = Sampler(CONFIG, stop_ids=(), batch_size=4, max_len=64, mesh=mesh, rules=rules,
                      options=SamplerOptions(sampling=SamplingConfig(temperature=1.0), layout=layout))
    local = sampler_params(params, sampler)
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    per_device = device_bytes(local)
    assert len(per_device) == 8 and max(per_device.values()) <= 1.05 / 8 * total
    cache = sampler.init_state().cache
    cache_total = sum(x.nbytes for x in jax.tree.leaves(cache))
    cache_bytes = device_bytes(cache)
    assert len(cache_bytes) == 8 and max(cache_bytes.values()) <= 1.05 / 8 * cache_total
    rng = np.random.RandomState(3)
    prompts = [rng.randint(0, CONFIG.vocab_size, 3 + i).tolist() for i in range(4)]
    one_device = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), params)
    plain = Sampler(CONFIG, stop_ids=(), batch_size=4, max_len=64,
                    options=SamplerOptions(sampling=SamplingConfig(temperature=1.0), layout=layout))
    assert _tokens(sampler, local, prompts) == _tokens(plain, one_device, prompts)
