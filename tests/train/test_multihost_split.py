"""A split pod on several processes (`mesh.rollout_devices`): on 2 processes x 4 devices, the
first two devices of each process train (one training mesh over both processes) and its last
two sample that process's share of the groups, tensor parallel over the two; after each update
the weights move from the training mesh to every process's rollout devices, device to device,
through a staging layout in groups of two training devices, by a collective the main thread
issues at publish. The run equals the same split on 1 process x 8 devices, its sampler also
tensor parallel over two rollout devices."""

import importlib.util
import json
import math
import os

import jax
import numpy as np
import pytest

from tests.train import multihost_setup
from tests.train.configs import ROOT

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_split_worker.py")


def _written(n: int, out: str) -> list[dict]:
    return [json.load(open(os.path.join(out, f"process{i}.json"))) for i in range(n)]


@pytest.mark.slow
def test_a_split_pod_on_two_processes_matches_one_process(tmp_path):
    # One launch after the other, through the multi-host harness (logs to files; one failing
    # process stops the others and names its cause).
    one_dir, two_dir = str(tmp_path / "one"), str(tmp_path / "two")
    for n, out in ((1, one_dir), (2, two_dir)):
        os.makedirs(out)
        multihost_setup.wait(multihost_setup.Launch(WORKER, n, out, exact=True), timeout=900)
    (one,), two = _written(1, one_dir), _written(2, two_dir)

    # Where each part lives: the state on the training devices, each version's copy on the
    # process's own two rollout devices (1 process: devices 0-3 train, the sampler on 4 and 5).
    training = sorted(d for run in two for d in run["local_devices"][:2])  # each process's first two train
    for run in two:
        assert len(run["local_devices"]) == 4
        rollout_devices = run["local_devices"][2:]
        assert [(p["state_devices"], p["copy_devices"]) for p in run["published"]] == [(training, rollout_devices)]
    assert [(p["state_devices"], p["copy_devices"]) for p in one["published"]] == [([0, 1, 2, 3], [4, 5])]
    # Version 1 (after the first update; version 1 + 1 + k = 3 samples with it) is published,
    # on every process bitwise the training state's parameters, with host transfers forbidden.
    for run in [one] + two:
        assert [p["version"] for p in run["published"]] == [1] and run["published"][0]["equal"]
    np.testing.assert_allclose(two[0]["published"][0]["checksum"], one["published"][0]["checksum"], rtol=1e-5)

    # The same episodes: each process ran its half of the groups, token for token the one-process ones.
    key = lambda e: tuple(e[:3])  # (step, group, task id)
    ran_two = sorted(two[0]["ran"] + two[1]["ran"], key=key)
    ran_one = sorted(one["ran"], key=key)
    assert two[0]["ran"] and two[1]["ran"] and len(ran_two) == len(ran_one) == 3 * 2 * 2
    for e_two, e_one in zip(ran_two, ran_one):
        assert e_two[:3] == e_one[:3] and e_two[4:] == e_one[4:], e_one[:3]
        np.testing.assert_allclose(e_two[3], e_one[3], rtol=1e-5)
    # The same metrics, on every process (the schedule: steps 1, 2 sampled by version 0, step 3 by 1).
    rows = 2 * 2
    assert [(h["rollout/staleness_0"], h["rollout/staleness_1"]) for h in one["history"]] == \
        [(rows, 0), (0, rows), (0, rows)]
    assert sum(h["train/grad_norm"] > 0 for h in one["history"]) >= 1
    # The last step evaluated (on the rollout devices): its metrics are compared below with the rest.
    evaluated = [k for k in one["history"][-1] if k.startswith("eval/")]
    assert evaluated and not any(k.startswith("eval/") for h in one["history"][:-1] for k in h), evaluated
    for run in two:
        for h_two, h_one in zip(run["history"], one["history"], strict=True):
            assert h_two.keys() == h_one.keys()
            for k, v in h_one.items():
                if isinstance(v, str):  # the bandit's arm
                    assert h_two[k] == v, k
                elif not k.startswith("time/"):
                    np.testing.assert_allclose(h_two[k], v, rtol=1e-5, atol=1e-7, err_msg=k)


def _plan(hosts: int, **overrides):
    from jaxscaffold import config as config_lib
    from jaxscaffold.train import memory_plan
    from tests.train.configs import tiny_config

    cfg = config_lib.typed(tiny_config("unused", **{
        "mesh.devices": 0, "mesh.data": 1, "mesh.fsdp": -1, "rollout.tasks_per_step": 4, "rollout.group_size": 2,
        "rollout.max_staleness": 1, "mesh.rollout_devices": 4, **overrides}))
    return memory_plan.plan(cfg, hbm_bytes=16e9, devices=jax.devices()[:8], compile_step=False, hosts=hosts)


def test_the_plan_counts_a_split_over_hosts_per_device():
    """8 devices, 4 of them sampling: on 1 host the last 4; on 2 hosts of 4 the last 2 of each,
    each host sampling its half of the groups on them. Counted per device against byte counts
    of the tiny model (2 layers, 2 kv heads of 16, f32)."""
    from jaxscaffold.models import config as model_config_lib
    from jaxscaffold.models import qwen3

    one, two = _plan(1), _plan(2)
    total = sum(math.prod(s.shape) * s.dtype.itemsize for s in jax.tree.leaves(qwen3.param_shapes(
        model_config_lib.tiny())))
    # Training devices: 4 either way, the state sharded (fsdp) over them alike.
    assert two.params == one.params and two.opt_state == one.opt_state and one.params >= total / 4
    # Sampler weights: tensor parallel over each host's rollout devices (the norms replicated).
    assert total / 4 <= one.sampler_weights <= 1.01 * total / 4
    assert total / 2 <= two.sampler_weights <= 1.01 * total / 2
    # A token's keys and values on a device: 2 layers x its kv heads x 16 x 2 x 4 bytes; 2 kv
    # heads do not split over 4 devices (replicated) but do over 2; and each host's cache holds
    # its half of the rows.
    assert one.kv_token_bytes == 2 * 2 * 16 * 2 * 4 and two.kv_token_bytes == 2 * 1 * 16 * 2 * 4
    assert two.kv_cache < one.kv_cache
    # Publishing on 2 hosts stages the sampler's layout on the training devices; the rollout
    # devices hold the sampler's weights and the k = 1 published copy.
    assert one.staging == 0 and two.staging == two.sampler_weights
    assert two.train_peak == max(two.state + two.grads, two.state + two.staging)
    assert two.rollout_peak == 2 * two.sampler_weights + two.kv_cache
    # Splits that do not fit the hosts are refused, naming the field.
    for hosts, r in ((2, 3), (2, 6), (2, 8)):  # not even over the hosts; 1 left to train of 3 staged; none left
        with pytest.raises(ValueError, match=f"config.mesh.rollout_devices={r}: "):
            _plan(hosts, **{"mesh.rollout_devices": r})


def test_launch_plan_takes_the_hosts(capsys):
    """launch/plan.py --hosts: the JSON figures are the plan's on that many hosts; a split that
    does not fit them is a one-line error, exit 2."""
    spec = importlib.util.spec_from_file_location("plan_cli", os.path.join(ROOT, "launch", "plan.py"))
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    args = ["--config", "tiny.py", "--config.mesh.devices=0", "--config.mesh.data=1", "--config.mesh.fsdp=-1",
            "--config.rollout.tasks_per_step=4", "--config.rollout.group_size=2", "--config.rollout.max_staleness=1",
            "--devices", "8", "--hosts", "2"]
    assert cli.main(args + ["--config.mesh.rollout_devices=4", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    planned = _plan(2)
    for key in ("params", "sampler_weights", "kv_cache", "staging", "published", "rollout_peak"):
        assert printed[key] == getattr(planned, key), key
    assert cli.main(args + ["--config.mesh.rollout_devices=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: config.mesh.rollout_devices=3: ")


def test_the_move_to_rollout_devices_copies_each_shard_to_its_device():
    """`to_local` onto devices that hold none of the parameters (a split pod), with host
    transfers forbidden: the training state fsdp over devices 0-3, a host's sampler tensor
    parallel over devices 6 and 7: shard j of the staging group lands on rollout device j,
    checked shard by shard (the 2-process test checks each process's whole copy)."""
    from jaxscaffold.models import config as model_config_lib
    from jaxscaffold.models import qwen3
    from jaxscaffold.models.local_mesh import local_mesh, local_rules, to_local
    from jaxscaffold.models.sharding import MeshConfig, make_mesh

    config = model_config_lib.tiny()
    devices = jax.devices()[:8]
    params = qwen3.init_params(config, jax.random.key(0), mesh=make_mesh(MeshConfig(1, -1, 1), devices[:4]))
    mesh = local_mesh(devices[6:8])
    rules = local_rules(config, 2)
    with jax.transfer_guard_host_to_device("disallow"), jax.transfer_guard_device_to_host("disallow"):
        moved = to_local(params, config, mesh, rules)
    want = qwen3.param_shardings(config, mesh, rules)
    for x, y, s in zip(jax.tree.leaves(params), jax.tree.leaves(moved), jax.tree.leaves(want), strict=True):
        assert y.sharding.is_equivalent_to(s, y.ndim) and y.sharding.device_set == set(devices[6:8])
        assert np.array_equal(np.asarray(x), np.asarray(y))
        for shard in y.addressable_shards:  # each device holds its own slice (not only the whole agrees)
            assert np.array_equal(np.asarray(shard.data), np.asarray(x)[shard.index])
    assert any(not s.is_fully_replicated for s in jax.tree.leaves(want))  # something is split over the two
