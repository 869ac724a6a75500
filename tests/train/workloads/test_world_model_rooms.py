"""RWML's stage 1 and the WM-SFT baseline run by the one trainer on the rooms testbed (no data
to download, no embedder: the `lines` reward): the hand-off export, resume from the prepared
triples, and WM-SFT's cross-entropy falling on the real next states."""

import hashlib
import json

import jax
import numpy as np
import pytest

from tests.train.configs import load_config


def rooms_stage1(out_dir, **overrides):
    small = {"out_dir": str(out_dir), "steps": 2, "model.hf_path": "", "rollout.tasks_per_step": 2,
             "rollout.group_size": 2, "rollout.max_new_tokens": 16, "rollout.max_len": 1536,
             "rwml.collect_tasks": 4, "rwml.collect_max_turns": 4, "rwml.heldout_share": 0.25,
             "rwml.filter.sft_steps": 1, "rwml.filter.sft_batch": 2, "rwml.filter.samples": 2,
             "rwml.filter.sft_share": 0.2, "eval.every": 2, "eval.tasks": 2, "eval.at_start": False,
             "checkpoint.every": 2, "mesh.devices": 1}
    return load_config("rwml_rooms", **{**small, **overrides})


@pytest.mark.slow
def test_stage_one_exports_and_resumes_from_its_triples(tmp_path):
    from jaxscaffold.models import hf_io
    from jaxscaffold.train.trainer import train
    from jaxscaffold.train.workloads.world_model import DATA_FILE

    out = train(rooms_stage1(tmp_path / "wm"))
    hist = out["history"]
    assert [h["step"] for h in hist] == [1, 2]
    assert np.isfinite(hist[0]["train/loss"]) and np.isfinite(hist[0]["rollout/wm_accuracy"])
    assert hist[0]["triples/unique"] >= 4 and "eval/wm_accuracy" in hist[1]
    assert out["export"]["max_abs_logit_diff"] is not None  # rwml.export_dir's default: out_dir/hf
    digest = hashlib.sha1(open(tmp_path / "wm" / DATA_FILE, "rb").read()).hexdigest()
    again = train(rooms_stage1(tmp_path / "wm", steps=3, **{"eval.every": 0}))
    assert [h["step"] for h in again["history"]] == [1, 2, 3]
    assert hashlib.sha1(open(tmp_path / "wm" / DATA_FILE, "rb").read()).hexdigest() == digest
    _, exported = hf_io.load_pretrained(str(tmp_path / "wm" / "hf"))
    for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(again["state"].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_wm_sft_fits_the_next_states_and_resumes(tmp_path):
    from jaxscaffold.train.trainer import train
    cfg = rooms_stage1(tmp_path / "sft", steps=8, **{"rwml.objective": "sft", "rl.lr": 1e-2, "eval.every": 4,
                                                     "checkpoint.every": 4,
                                                     "rwml.export_dir": str(tmp_path / "sft_hf")})
    out = train(cfg)
    rows = [json.loads(line) for line in open(tmp_path / "sft" / "metrics.jsonl")]
    nll = [m["train/nll"] for m in rows if "train/nll" in m]
    assert len(nll) == 8 and np.mean(nll[-3:]) < 0.85 * np.mean(nll[:3]), nll
    last = out["history"][-1]
    assert "eval/wm_accuracy" in last and last["triples/train"] >= 1 and last["train/lr"] == 1e-2
    assert (tmp_path / "sft_hf" / "config.json").exists()
    # Resumed from step 4, the batches of steps 5-8 are those of the uninterrupted run.
    import shutil
    shutil.rmtree(tmp_path / "sft" / "checkpoints" / "8")
    again = train(cfg)
    assert [h["step"] for h in again["history"]][-4:] == [5, 6, 7, 8]
    resumed = [h["train/nll"] for h in again["history"] if h["step"] > 4]
    np.testing.assert_allclose(resumed, nll[4:], rtol=1e-5)
