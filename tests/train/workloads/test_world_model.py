"""RWML end to end on CPU: stage 1 (world-model RL on real ALFWorld triples, with the
difficulty filter and the embedding reward) -> HF export -> stage 2 (task RL from it); and
the WM-SFT baseline."""

import hashlib
import json
import os

import jax
import numpy as np
import pytest

from tests.train.configs import load_config  # noqa: E402
from tests.envs.conftest import alfworld_data  # noqa: F401,E402  (shared fixtures)

pytest.importorskip("sentence_transformers")


def stage1_config(out_dir, **overrides):
    small = {"out_dir": str(out_dir), "steps": 2, "rollout.tasks_per_step": 2, "rollout.group_size": 2,
             "rollout.max_new_tokens": 8, "rollout.max_len": 512, "envs.num_workers": 0,
             "rwml.collect_tasks": 4, "rwml.collect_max_turns": 4, "rwml.history_window": 0,
             "rwml.max_obs_chars": 300, "rwml.heldout_share": 0.25, "rwml.filter.sft_steps": 2,
             "rwml.filter.sft_batch": 2, "rwml.filter.samples": 2, "rwml.filter.sft_share": 0.2,
             "eval.every": 2, "eval.tasks": 4, "eval.at_start": False, "checkpoint.every": 2, "mesh.devices": 1}
    return load_config("rwml_tiny", **{**small, **overrides})


@pytest.fixture(scope="module")
def alfworld_env(alfworld_data):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALFWORLD_DATA", str(alfworld_data.root))
        yield


@pytest.mark.slow
def test_two_stages_end_to_end(tmp_path, alfworld_env):
    from jaxscaffold.models import hf_io
    from jaxscaffold.train.trainer import train
    from jaxscaffold.train.workloads.world_model import DATA_FILE

    out = train(stage1_config(tmp_path / "wm"))  # job rwml: stage 1, then the hand-off export
    hist = out["history"]
    assert [h["step"] for h in hist] == [1, 2]
    first = hist[0]
    for key in ("triples/unique", "triples/train", "triples/heldout", "filter/scored", "filter/kept",
                "rollout/wm_accuracy", "rollout/wm_parsed", "train/kl", "train/loss"):
        assert np.isfinite(first[key]), key
    assert first["triples/unique"] >= 8 and first["filter/scored"] >= 1
    assert {"eval/success", "eval/wm_accuracy", "eval/wm_mean_distance"} <= set(hist[1])
    rows = [json.loads(line) for line in open(tmp_path / "wm" / DATA_FILE)]
    assert {r["split"] for r in rows} == {"train", "heldout", "predictor"}
    held_tasks = {r["task_id"] for r in rows if r["split"] == "heldout"}
    assert held_tasks.isdisjoint({r["task_id"] for r in rows if r["split"] != "heldout"})
    assert out["export"]["max_abs_logit_diff"] < 1e-4  # transformers reloads the export with equal logits

    # Resuming reads the prepared data set back instead of collecting again.
    digest = hashlib.sha1(open(tmp_path / "wm" / DATA_FILE, "rb").read()).hexdigest()
    again = train(stage1_config(tmp_path / "wm", steps=3, **{"eval.every": 0}))
    assert [h["step"] for h in again["history"]] == [1, 2, 3]
    assert hashlib.sha1(open(tmp_path / "wm" / DATA_FILE, "rb").read()).hexdigest() == digest

    # Stage 2 starts from exactly the exported world model.
    hf = str(tmp_path / "wm" / "hf")
    _, exported = hf_io.load_pretrained(hf)
    for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(again["state"].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    policy = load_config("rwml_policy", **{
        "out_dir": str(tmp_path / "policy"), "steps": 1, "model.hf_path": hf, "model.compute_dtype": "float32",
        "model.cache_dtype": "float32", "model.remat_policy": "none", "rollout.tasks_per_step": 2,
        "rollout.group_size": 2, "rollout.max_turns": 2, "rollout.max_new_tokens": 8, "rollout.max_len": 2048,
        "rollout.enable_thinking": False, "envs.train_split": "valid_seen", "envs.eval": "alfworld:valid_seen",
        "envs.num_workers": 0, "eval.every": 1, "eval.tasks": 2, "eval.at_start": False, "eval.max_turns": 2,
        "checkpoint.every": 1,
        "mesh.fsdp": 1, "mesh.data": -1, "mesh.devices": 1})
    hist = train(policy)["history"]
    assert len(hist) == 1 and np.isfinite(hist[0]["train/loss"]) and "eval/success_alfworld" in hist[0]


def test_epochs_set_the_steps_from_the_filtered_triples():
    from jaxscaffold.train.workloads.world_model import epoch_steps
    assert epoch_steps(1600, 32, 2.0) == 100  # the paper's "2 epochs" of ~1,600 triples
    assert epoch_steps(22_500, 32, 2.0) == 1407  # what a full collection can yield
    assert epoch_steps(3, 32, 2.0) == 1 and epoch_steps(33, 32, 1.0) == 2


def test_the_evaluation_sample_spans_the_held_out_tasks():
    from jaxscaffold.train.workloads.world_model import evaluation_sample
    from jaxscaffold.worldmodel.triples import Triple
    heldout = [Triple("alfworld", f"task{t}", (), f"s{t}.{i}", "go", f"n{t}.{i}") for t in range(10) for i in range(30)]
    sample = evaluation_sample(heldout, 32, seed=5)
    assert len(sample) == len({t.key() for t in sample}) == 32
    assert len({t.task_id for t in sample}) >= 8  # the first 32 in episode order hold 2 tasks
    assert sample == evaluation_sample(heldout, 32, seed=5) != evaluation_sample(heldout, 32, seed=6)
    assert evaluation_sample(heldout[:5], 32, seed=5) == heldout[:5]


@pytest.mark.slow
def test_wm_sft_baseline_runs_for_its_epochs_and_fits_the_next_states(tmp_path, alfworld_env):
    """One WM-SFT run (one collection; two runs' worth of properties): it stops after
    rwml.epochs of the triples (not at `steps`), its NLL falls, it evaluates and exports."""
    from jaxscaffold.train.trainer import train
    out = train(stage1_config(tmp_path / "sft", steps=99, **{
        "rwml.objective": "sft", "rwml.epochs": 1.5, "rl.lr": 1e-2, "rwml.export_dir": str(tmp_path / "sft_hf")}))
    last = out["history"][-1]
    assert last["step"] == int(np.ceil(1.5 * last["triples/train"] / 2)) != 99 and last["triples/empty_next_state"] >= 0
    metrics = [json.loads(line) for line in open(tmp_path / "sft" / "metrics.jsonl")]
    nll = [m["train/nll"] for m in metrics if "train/nll" in m]
    assert len(nll) == last["step"] >= 6 and np.mean(nll[-3:]) < 0.85 * np.mean(nll[:3]), nll
    evaluated = [h for h in out["history"] if h["step"] % 2 == 0]  # eval.every 2
    assert evaluated and all("eval/wm_accuracy" in h for h in evaluated)
    assert os.path.exists(tmp_path / "sft_hf" / "config.json")
