"""Supervised fine-tuning as a workload of the one trainer (`train.workloads.sft`): the gold
demonstrations it renders, and that its steps lower the demonstrations' cross-entropy, computed
here independently from the model's logits."""

import json

import jax
import numpy as np
import pytest

from jaxscaffold.envs import registry
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.models import qwen3
from jaxscaffold.train.job import build_job
from jaxscaffold.train.trainer import train
from jaxscaffold.train.workloads.base import registered, workload_for, workload_name
from jaxscaffold.train.workloads.sft import SFTWorkload, gold_demonstrations
from tests.train.configs import load_config

SMALL = {"steps": 6, "rollout.tasks_per_step": 4, "envs.train": "letters:train:8", "envs.num_workers": 0,
         "mesh.devices": 1, "eval.every": 6, "eval.at_start": False, "checkpoint.every": 6, "rl.lr": 3e-3}


def masked_nll(params, config, conversations) -> float:
    """Mean negative log-likelihood of the assistant tokens, from plain logits (no batching code)."""
    total, count = 0.0, 0
    for conv in conversations:
        ids = np.asarray(conv.ids)
        logits = np.asarray(qwen3.forward(params, config, ids[None, :-1]))[0].astype(np.float64)
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        target = np.asarray(conv.assistant_mask[1:], bool)
        total -= logp[np.arange(len(ids) - 1), ids[1:]][target].sum()
        count += int(target.sum())
    return total / count


def test_the_registry_names_each_job():
    assert {"rl", "rwml", "wm_sft", "sft"} <= set(registered())
    cfg = load_config("sft")
    assert workload_name(cfg) == "sft" and workload_for(cfg) is SFTWorkload
    assert workload_name(load_config("rwml_tiny", **{"rwml.objective": "sft"})) == "wm_sft"
    assert workload_name(load_config("rwml_tiny")) == "rwml" and workload_name(load_config("tiny")) == "rl"


def test_gold_demonstrations_train_on_the_gold_answers_only(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text('{"id": "a", "prompt": "What is 2 + 2?", "answer": "4"}\n'
                    '{"id": "b", "prompt": "Capital of France?", "answer": ["Paris", "paris"]}\n'
                    '{"id": "c", "prompt": "No answer given"}\n')
    cfg = load_config("sft", **{**SMALL, "out_dir": str(tmp_path / "run"), "envs.train": f"jsonl:{data}"})
    job, _ = build_job(cfg)
    tasks = registry.catalogue("jsonl", str(data))
    envs = LocalEnvs({"jsonl": registry.factory("jsonl")})
    demos, stats = gold_demonstrations(job, envs, tasks)
    assert [t.task_id for t, _ in demos] == ["a", "b"]  # "c" has no answer: gold cannot win it
    assert stats["sft/tasks"] == 3 and stats["sft/gold_won"] == 2
    for (task, conv), answer in zip(demos, ["4", "Paris"]):
        trained = [i for i, m in zip(conv.ids, conv.assistant_mask) if m]
        assert job.tokenizer.decode(trained) == answer + "<|im_end|>"
        assert task.spec["item"]["prompt"] in job.tokenizer.decode(conv.ids)


@pytest.mark.slow
def test_sft_lowers_the_demonstrations_loss(tmp_path):
    cfg = load_config("sft", **{**SMALL, "out_dir": str(tmp_path / "run")})
    job, state = build_job(cfg)
    initial = jax.tree.map(np.asarray, state.params)
    work = SFTWorkload(job, state.params)
    demos = [conv for _, conv in work.demonstrations]
    work.close()
    out = train(cfg)
    hist = out["history"]
    assert [h["step"] for h in hist] == list(range(1, 7)) and hist[0]["sft/demonstrations"] == len(demos) == 8
    before, after = masked_nll(initial, job.model_config, demos), masked_nll(out["state"].params, job.model_config, demos)
    assert after < 0.85 * before, (before, after)
    # The step's own loss is that cross-entropy on its batch: at step 1, of the initial model.
    assert abs(hist[0]["train/nll"] - before) < 0.05 * before
    assert "eval/success" in hist[-1]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert sum("train/nll" in r for r in rows) == 6
