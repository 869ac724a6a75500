"""Feedback in the loop: every enrichment is logged (out_dir/feedback.jsonl) and counted, with
one decision per group; the learned (bandit) schedule logs its arms and resumes identically."""

import json
import shutil

import jax
import numpy as np
import pytest

from jaxscaffold.feedback import bandit
from jaxscaffold.train.checkpoint import Checkpointer
from jaxscaffold.train.trainer import train
from jaxscaffold.train.workloads.env_rl import EnvWorkload
from tests.train import toy_envs
from tests.train.configs import tiny_config


def coin_config(out_dir, **overrides):
    """The test's tiny config on the toy `coin` env (up to 3 steps, AG and OE enrichers), on the
    word vocabulary: coin rewards any text, and the logs and resume checked here do not depend
    on Qwen3's vocabulary."""
    return tiny_config(out_dir, words=True, **{"envs.train": "coin", "envs.eval": "coin", "rollout.max_turns": 3,
                                   "rollout.max_len": 256, "eval.every": 0, **overrides})


def recording(into: dict):
    class Recording(EnvWorkload):
        def collect(self, job, params, step):
            episodes, stats = super().collect(job, params, step)
            into[step] = episodes
            return episodes, stats
    return Recording


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_enrichment_is_logged_counted_and_group_consistent(tmp_path, monkeypatch):
    toy_envs.register(monkeypatch)
    ran = {}
    cfg = coin_config(tmp_path, steps=2, **{"rollout.tasks_per_step": 4, "feedback.schedule": "ag_early",
                                           "feedback.probability": 0.5, "feedback.mode": "group",
                                           "checkpoint.every": 2})
    hist = train(cfg, workload=recording(ran))["history"]
    lines = _lines(tmp_path / "feedback.jsonl")
    assert {tuple(sorted(line)) for line in lines} == {
        ("env", "episode_step", "group", "kept", "kind", "rollout", "schedule", "step", "task")}
    decided = set()  # (step, group, got AG at the first observation)
    for h in hist:
        step = h["step"]
        logged = [line for line in lines if line["step"] == step]
        # Counted in the metrics: enrichments and the groups that got them.
        assert h["rollout/feedback_ag"] == len(logged) > 0 and h["rollout/feedback_oe"] == 0
        assert h["rollout/feedback_groups_ag"] == len({line["group"] for line in logged})
        groups = {}
        for e in ran[step]:
            groups.setdefault(e.group, []).append(e)
        assert len(groups) == 4
        for g, episodes in groups.items():
            for r, e in enumerate(episodes):  # the log holds exactly each episode's enrichments
                mine = [line for line in logged if (line["group"], line["rollout"]) == (g, r)]
                assert [(line["episode_step"], line["kind"]) for line in mine] == list(e.feedback)
                assert all(line["task"] == e.task.task_id and line["schedule"] == "ag_early" for line in mine)
            # Mode "group": on the episode steps every rollout of the group reached (observations
            # 0 .. steps - 1 are rendered), all rollouts got the same decisions.
            reached = min(e.steps for e in episodes)
            decisions = {tuple((s, k) for s, k in e.feedback if s < reached) for e in episodes}
            assert len(decisions) == 1, (step, g, [e.feedback for e in episodes])
            decided.add((step, g, (0, "ag") in next(iter(decisions))))
    assert {got for *_, got in decided} == {True, False}  # p = 0.5: some groups got it, some not


@pytest.mark.slow
def test_bandit_schedule_logs_its_arms_and_resumes_identically(tmp_path, monkeypatch):
    """A run killed after step 3 (its last checkpoint at step 2) and resumed ends with exactly
    the parameters, metrics and logs of an uninterrupted run, the bandit's posterior included."""
    toy_envs.register(monkeypatch)
    over = {"feedback.schedule": "bandit", "feedback.probability": 1.0, "checkpoint.every": 2}
    straight = train(coin_config(tmp_path / "a", steps=4, **over))
    train(coin_config(tmp_path / "b", steps=3, **over))
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "3")  # "killed" after step 3, before its checkpoint
    resumed = train(coin_config(tmp_path / "b", steps=4, **over))
    for a, b in zip(jax.tree.leaves(straight["state"].params), jax.tree.leaves(resumed["state"].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    no_time = lambda h: {k: v for k, v in h.items() if not k.startswith("time/")}  # noqa: E731
    assert [no_time(h) for h in straight["history"]] == [no_time(h) for h in resumed["history"]]
    hist = straight["history"]
    arms = [h["feedback/arm"] for h in hist]
    assert set(arms) <= set(bandit.DEFAULT_ARMS) and len(set(arms)) > 1
    for h in hist:
        assert h["feedback/arm_index"] == bandit.DEFAULT_ARMS.index(h["feedback/arm"])
        assert 0.0 <= h["feedback/signal"] <= 1.0
        values = [h[f"feedback/value_{a}"] for a in bandit.DEFAULT_ARMS]
        assert all(0.0 < v < 1.0 for v in values)
    # The arm's schedule is what the episodes got (probability 1: AG early = AG on step 0).
    for h in hist:
        if h["feedback/arm"] == "none":
            assert h["rollout/feedback_ag"] == h["rollout/feedback_oe"] == 0
        if h["feedback/arm"] == "ag_early":
            assert h["rollout/feedback_groups_ag"] == 2 and h["rollout/feedback_oe"] == 0
    # The posterior is in the checkpoint, and the logs hold each step once after the resume.
    ckpt = Checkpointer(str(tmp_path / "b" / "checkpoints"))
    state = bandit.BanditState.from_dict(ckpt.restore_extra()["workload"]["bandit"])
    ckpt.close()
    np.testing.assert_allclose(state.means(), [hist[-1][f"feedback/value_{a}"] for a in state.arms])
    assert [line["step"] for line in _lines(tmp_path / "b" / "metrics.jsonl")] == [1, 2, 3, 4]
    a_log, b_log = (tmp_path / "a" / "feedback.jsonl").read_text(), (tmp_path / "b" / "feedback.jsonl").read_text()
    assert b_log == a_log
    # Episodes of at most 3 steps only reach the early windows (episode steps 0-2).
    logged = {line["schedule"] for line in _lines(tmp_path / "a" / "feedback.jsonl")}
    assert logged == {a for a in arms if a in ("ag_early", "oe_early")}
