"""Per-host rollout meshes: on 2 processes x 4 devices each process samples on its own 4
devices, the parameters resharded onto them from the training mesh on device (tensor
parallel, `multihost.sampler_params`); the tokens are the one-process run's."""

import json
import os

import pytest

from tests.train import multihost_setup

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_rollout_worker.py")
LAYOUTS = ("per_layer", "stacked")


def _launch(n: int, out: str) -> multihost_setup.Launch:
    os.makedirs(out, exist_ok=True)
    return multihost_setup.Launch(WORKER, n, out, exact=True)


def _written(n: int, out: str) -> list[dict]:
    return [json.load(open(os.path.join(out, f"process{i}.json"))) for i in range(n)]


@pytest.mark.slow
def test_per_host_meshes_sample_the_one_process_tokens_on_a_quarter_of_the_model(tmp_path):
    # The one-process reference and the two processes run at the same time.
    one_dir, two_dir = str(tmp_path / "one"), str(tmp_path / "two")
    multihost_setup.wait(_launch(1, one_dir), _launch(2, two_dir), timeout=600)
    (one,), two = _written(1, one_dir), _written(2, two_dir)
    assert two[0]["local_devices"] != two[1]["local_devices"]
    for layout in LAYOUTS:
        # Tokens (T = 1, per-prompt seeds): every prompt, on its process, samples what the one
        # process run and the whole model on one device sample.
        tokens = {**two[0][layout]["tokens"], **two[1][layout]["tokens"]}
        assert set(two[0][layout]["tokens"]).isdisjoint(two[1][layout]["tokens"])
        assert tokens.keys() == one[layout]["tokens"].keys() == one[layout]["tokens_one_device"].keys()
        for k, (toks, logps) in one[layout]["tokens"].items():
            assert tokens[k][0] == toks == one[layout]["tokens_one_device"][k][0], (layout, k)
            assert max(abs(a - b) for a, b in zip(tokens[k][1], logps)) < 1e-4
        for run, process in zip(two, (0, 1)):
            r = run[layout]
            # Each process's sampler arrays live on its own 4 devices, each holding a quarter
            # (the norms are replicated: 1% of this model) of the parameters, of the layout the
            # sampler decodes with, and of the KV cache (sharded over the 4 kv heads).
            assert r["devices"] == run["local_devices"] and len(r["devices"]) == 4
            assert r["share"] <= 1.05 / 4 and r["prepared_share"] <= 1.05 / 4, (layout, r)
            assert r["cache_share"] <= 1.05 / 4, (layout, r)
    # LoRA's merged parameters: resharded alike, the one-process tokens, which the merge changed.
    lora = {**two[0]["lora"]["tokens"], **two[1]["lora"]["tokens"]}
    assert lora.keys() == one["lora"]["tokens"].keys()
    assert all(lora[k][0] == toks for k, (toks, _) in one["lora"]["tokens"].items())
    assert any(lora[k][0] != toks for k, (toks, _) in one["per_layer"]["tokens"].items())
    assert max(run["lora"]["share"] for run in two) <= 1.05 / 4
    # Host memory around the reshard of a 71 MB model. On CPU a device's buffers are host
    # memory, so the reshard's result (the model once per process, a quarter on each device)
    # shows up in RSS; beyond it the peak grows by less than a quarter of the model. The old
    # path (process_allgather: a host copy of the whole model) grows by a model more, and the
    # host-to-device transfer guard, which the reshard passed, catches its way back onto a device.
    for run in two:
        m = run["memory"]
        assert m["share"] <= 1.05 / 4
        assert m["reshard_peak_growth"] <= m["reshard_held"] + 0.25 * m["model_bytes"], m
        assert m["gather_peak_growth"] - m["reshard_peak_growth"] >= 0.75 * m["model_bytes"], m
        assert m["guard_caught_gather"]
