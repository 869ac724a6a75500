"""The main job end to end on CPU: the embedded default runs, and resume continues identically."""

import importlib.util
import json
import os

import jax
import numpy as np
import pytest

from jaxscaffold.train.loop import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_config(out_dir, **overrides):
    spec = importlib.util.spec_from_file_location("tiny", os.path.join(ROOT, "configs", "tiny.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.get_config()
    cfg.out_dir = str(out_dir)
    cfg.rollout.tasks_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens = 2, 4, 8
    cfg.envs.num_workers = 0
    cfg.eval.tasks = 4
    for k, v in overrides.items():
        node = cfg
        *path, last = k.split(".")
        for p in path:
            node = node[p]
        node[last] = v
    return cfg


def test_embedded_default_smoke(tmp_path):
    out = train(tiny_config(tmp_path, steps=4, **{"eval.every": 2, "checkpoint.every": 2}))
    hist = out["history"]
    assert [h["step"] for h in hist] == [1, 2, 3, 4]
    assert "eval/success" in hist[1] and "eval/success_peak" in hist[3]
    for key in ("rollout/reward", "train/entropy", "train/clipfrac_upper", "time/rollout_s", "time/train_s"):
        assert all(np.isfinite(h[key]) for h in hist), key
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert os.listdir(tmp_path / "tb")
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 4


def test_resume_continues_identically(tmp_path):
    straight = train(tiny_config(tmp_path / "a", steps=6, **{"eval.every": 0, "checkpoint.every": 3}))
    train(tiny_config(tmp_path / "b", steps=3, **{"eval.every": 0, "checkpoint.every": 3}))  # then "killed"
    resumed = train(tiny_config(tmp_path / "b", steps=6, **{"eval.every": 0, "checkpoint.every": 3}))
    for a, b in zip(jax.tree.leaves(straight["state"].params), jax.tree.leaves(resumed["state"].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    drop = ("time/", )
    for ha, hb in zip(straight["history"], resumed["history"]):
        assert {k: v for k, v in ha.items() if not k.startswith(drop)} == \
               {k: v for k, v in hb.items() if not k.startswith(drop)}


def test_export_reloads_in_transformers_with_equal_logits(tmp_path):
    import subprocess, sys
    train(tiny_config(tmp_path / "run", steps=1, **{"eval.every": 0, "checkpoint.every": 1}))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "export_hf.py"), "--checkpoint",
                          str(tmp_path / "run"), "--out", str(tmp_path / "hf")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    diff = float(out.stdout.strip().split("=")[-1])
    assert diff < 1e-4, out.stdout
    assert (tmp_path / "hf" / "tokenizer.json").exists()
    missing = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "export_hf.py"), "--checkpoint",
                              str(tmp_path / "nope"), "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert missing.returncode != 0 and "no checkpoint directory" in missing.stderr
