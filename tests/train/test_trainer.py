"""The main job end to end on CPU (`train.trainer.train`): the embedded default runs (resuming
identically is tested with the learned feedback schedule, in test_feedback_log.py)."""

import json
import os

import jax
import numpy as np
import pytest

from jaxscaffold.train import trainer
from jaxscaffold.train.trainer import train
from jaxscaffold.train.workloads.env_rl import EnvWorkload
from tests.in_process import run_script
from tests.test_readme import run_the_runnable_block
from tests.train.configs import load_config, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPORT_HF = os.path.join(ROOT, "launch", "export_hf.py")


@pytest.mark.slow
def test_embedded_default_smoke(tmp_path):
    """The embedded default, smaller: letters training, and evaluation on letters and real
    ScienceWorld and BFCL tasks through the env pool, as configs/tiny.py's docstring shows. It
    writes to the demo's own out_dir (runs/tiny) in a working directory, where the README's
    runnable block then runs as written: an example that reused the demo's out_dir would fail."""
    run = tmp_path / load_config("tiny").out_dir
    real = {"envs.eval": "letters:test:8,sciworld:test:2,bfcl:validation:2", "eval.max_len": 4096}  # as tiny.py says
    # Two steps: the first compiles, the second reruns the compiled programs after a saved
    # checkpoint, then evaluates (steps 3 and 4 only repeated step 2: ~14 CPU-s, measured)
    out = train(tiny_config(run, real_eval=True, steps=2, **{"eval.every": 2, "checkpoint.every": 1,
                                                            "envs.num_workers": 1, "mesh.devices": 0, **real}))
    assert len(jax.tree.leaves(out["state"].params)[0].sharding.device_set) == jax.device_count() == 8
    hist = out["history"]
    assert [h["step"] for h in hist] == [1, 2]
    assert "eval/success_peak" in hist[1] and hist[1]["eval/infra_failures"] == 0
    assert {"eval/success_letters", "eval/success_sciworld", "eval/success_bfcl"} <= hist[1].keys()
    for key in ("rollout/reward", "train/entropy", "train/clipfrac_upper", "time/rollout_s", "time/train_s"):
        assert all(np.isfinite(h[key]) for h in hist), key
    assert (run / "curves.png").stat().st_size > 1000
    assert os.listdir(run / "tb")
    metrics = (run / "metrics.jsonl").read_text()
    assert len(metrics.splitlines()) == 2
    run_the_runnable_block(tmp_path)  # after the demo, in its working directory
    assert (run / "metrics.jsonl").read_text() == metrics  # the demo's run untouched


@pytest.mark.slow
def test_checkpoint_without_its_keys_falls_back_to_the_previous_one(tmp_path, caplog):
    """A checkpoint whose JSON lacks what resuming needs (written before the workload state
    existed, or damaged) is skipped like an unreadable one: the run resumes from the previous
    step; when no step has the keys, one CheckpointCorrupt line names each."""
    from jaxscaffold.train.checkpoint import CheckpointCorrupt, Checkpointer
    first = train(tiny_config(tmp_path, steps=1, words=True, **{"eval.every": 0, "checkpoint.every": 1}))
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    ckpt.save(2, first["state"], {"step": 2, "history": first["history"]})  # no "workload"
    ckpt.close()
    out = train(tiny_config(tmp_path, steps=2, words=True, **{"eval.every": 0, "checkpoint.every": 1}))
    assert [h["step"] for h in out["history"]] == [1, 2]  # step 1 restored, step 2 redone
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "checkpoint" in r.name]
    assert any("lacks ['workload']" in w and "resuming from step 1" in w for w in warnings), warnings
    other = tmp_path / "other"
    ckpt = Checkpointer(str(other / "checkpoints"), async_save=False)
    ckpt.save(1, first["state"], {"step": 1})
    ckpt.close()
    with pytest.raises(CheckpointCorrupt, match=r"step 1: CheckpointDamaged: its JSON document lacks"):
        train(tiny_config(other, steps=2, words=True, **{"eval.every": 0, "checkpoint.every": 1}))


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    """A tiny run of 1 step, resumed to 2 (a checkpoint each step), trained once for the tests
    that damage its checkpoints (each on a copy, `copy_of`): its directory, the 1-step run's
    result and the 2-step one's. On the word vocabulary: what these tests check (checkpoints,
    resume, export's files and logits) does not depend on Qwen3's; a Qwen-vocabulary export
    is verified against transformers in tests/train/test_export.py."""
    path = tmp_path_factory.mktemp("two_step_run")
    cfg = lambda steps: tiny_config(path, steps=steps, words=True, **{"eval.every": 0, "checkpoint.every": 1})
    first = train(cfg(1))
    return path, first, train(cfg(2))


def copy_of(run, tmp_path):
    """`run`'s directory copied to `tmp_path` (a run's files name no absolute path)."""
    import shutil
    shutil.copytree(run[0], tmp_path, dirs_exist_ok=True)
    return tmp_path


def _damage_params(step_dir, how: str) -> None:
    """Truncates (inside the value) or deletes the OCDBT data file holding a step's largest
    saved parameter. Orbax packs parameters and Adam moments into shared data files in an order
    that varies by run, so the largest file need not hold a parameter; export reads the
    parameters alone and rightly ignores damage to the moments."""
    import tensorstore as ts
    state = step_dir / "state"
    base = ts.KvStore.open({"driver": "file", "path": f"{state}/"}).result()
    version = ts.ocdbt.dump(base).result()["versions"][-1]
    assert version["root_height"] == 0, version  # one B-tree node: the tiny model
    node = ts.ocdbt.dump(base, version["root"]["location"]).result()
    refs = [e["indirect_value"].split(":") for e in node["entries"]
            if "indirect_value" in e and e["key"].startswith(b"params.")]
    _, prefix, name, offset, length = max(refs, key=lambda r: int(r[-1]))  # value:<prefix>:<file>:<off>:<len>
    path = state / prefix / name
    if how == "truncate":
        os.truncate(path, int(offset) + int(length) // 2)
    else:
        path.unlink()


def _damage(step_dir, how: str) -> None:
    """Truncates or deletes the largest array file of a saved step (Orbax's OCDBT data)."""
    biggest = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    if how == "truncate":
        os.truncate(biggest, biggest.stat().st_size // 2)
    else:
        biggest.unlink()


@pytest.mark.parametrize("how", ["truncate", "delete"])
def test_a_damaged_latest_checkpoint_resumes_from_the_previous_one(two_step_run, tmp_path, how, caplog, capsys):
    """The latest checkpoint damaged on disk: one warning line says so, the run resumes from
    the newest intact one (its first collected step follows that checkpoint, with that
    checkpoint's parameters) and saves the redone steps again. Intact, that finished run
    returns at once when started again (no model built), its changed config still refused."""
    from jaxscaffold.config import ConfigError
    cfg = lambda steps, **more: tiny_config(tmp_path, steps=steps, words=True, **{"eval.every": 0, "checkpoint.every": 1, **more})
    _, first, second = two_step_run
    copy_of(two_step_run, tmp_path)
    params_1 = [np.asarray(x) for x in jax.tree.leaves(first["state"].params)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer, "build_job", lambda cfg: pytest.fail("a finished run built its model"))
        for steps in (2, 1):  # at its end, or past it
            again = train(cfg(steps))
            assert again["state"] is None and again["history"] == second["history"]
        with pytest.raises(ConfigError, match=r"changes rl\.lr"):
            train(cfg(2, **{"rl.lr": 0.5}))
    assert "finished at step 2, nothing to train" in capsys.readouterr().err
    _damage(tmp_path / "checkpoints" / "2", how)
    seen = {}

    class Recording(EnvWorkload):
        def collect(self, job, params, step):
            seen.setdefault(step, [np.asarray(x) for x in jax.tree.leaves(params)])
            return super().collect(job, params, step)

    out = train(cfg(2), workload=Recording)
    assert list(seen) == [2]  # resumed after step 1, not from scratch
    for a, b in zip(seen[2], params_1):
        np.testing.assert_array_equal(a, b)
    assert [h["step"] for h in out["history"]] == [1, 2] and out["history"][0] == first["history"][0]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "checkpoint" in r.name]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "step 2" in warnings[0] and "resuming from step 1" in warnings[0]
    assert (tmp_path / "checkpoints.corrupt" / "2").is_dir()
    from jaxscaffold.train.checkpoint import saved_steps
    assert saved_steps(str(tmp_path / "checkpoints")) == [1, 2]  # step 2 saved again


def test_kl_to_the_frozen_initial_policy(tmp_path):
    """kl_coef > 0 trains against a frozen copy of the initial parameters: zero KL at the first
    step (policy == reference), positive once the policy has moved."""
    out = train(tiny_config(tmp_path, steps=3, words=True, **{"rl.kl_coef": 0.1, "eval.every": 0, "checkpoint.every": 3}))
    assert jax.tree.leaves(out["state"].params)[0].sharding.device_set == {jax.devices()[0]}  # mesh.devices = 1
    hist = out["history"]
    assert abs(hist[0]["train/kl"]) < 1e-6
    assert hist[2]["train/kl"] > 1e-6


def test_dapo_dynamic_sampling_trains_only_on_groups_of_mixed_success(tmp_path, monkeypatch):
    """rl.algorithm=dapo: each step generates batches until `tasks_per_step` groups have mixed
    binary success; the all-fail / all-success ones are dropped and counted."""
    from tests.train import toy_envs
    toy_envs.register(monkeypatch)  # success ~ 1/5 for a random policy: groups of both kinds
    kept = {}

    class Recording(EnvWorkload):
        def collect(self, job, params, step):
            episodes, stats = super().collect(job, params, step)
            kept[step] = episodes
            return episodes, stats

    cfg = tiny_config(tmp_path, steps=2, words=True, **{"rl.algorithm": "dapo", "envs.train": "coin", "envs.eval": "coin",
                                           "rollout.max_turns": 3, "rollout.max_len": 256, "eval.every": 0,
                                           "checkpoint.every": 2})
    hist = train(cfg, workload=Recording)["history"]
    tasks, group_size = cfg.rollout.tasks_per_step, cfg.rollout.group_size
    for h in hist:
        groups = {}
        for e in kept[h["step"]]:
            groups.setdefault(e.group, []).append(e.won)
        assert len(groups) == tasks and all(len(won) == group_size and len(set(won)) == 2 for won in groups.values())
        assert h["rollout/generation_batches"] >= 1
        seen = h["rollout/generation_batches"] * tasks
        assert seen == tasks + h["rollout/dropped_groups"] + h["rollout/overflow_groups"]
        assert 0 < h["rollout/success"] < 1 and np.isfinite(h["train/loss"])
    assert sum(h["rollout/dropped_groups"] for h in hist) >= 1


def test_export_reloads_in_transformers_with_equal_logits(two_step_run, tmp_path):
    """(The module's trained run: export only reads it.)"""
    run = two_step_run[0]
    files = sorted((str(p), p.stat().st_size) for p in run.rglob("*"))
    # In this process, saving a process start and its imports (jax, torch, transformers):
    # test_export_of_a_damaged_checkpoint_is_one_line runs launch/export_hf.py as a command.
    code, out, err = run_script(EXPORT_HF, ["--checkpoint", run, "--out", tmp_path / "hf"], capture=True)
    assert sorted((str(p), p.stat().st_size) for p in run.rglob("*")) == files  # the shared run untouched
    assert code in (0, None), err[-2000:]
    assert "exported step 2" in out
    diff = float(out.strip().split("=")[-1])
    assert diff < 1e-4, out
    assert (tmp_path / "hf" / "tokenizer.json").exists()
    code, _, err = run_script(EXPORT_HF, ["--checkpoint", tmp_path / "nope", "--out", tmp_path / "x"], capture=True)
    assert code not in (0, None) and "no checkpoint directory" in err


@pytest.mark.slow
def test_loop_on_real_sciworld_through_the_pool(tmp_path):
    """Two steps of the whole loop on real ScienceWorld episodes in worker processes
    (a random model only produces invalid actions: this checks the plumbing, not learning),
    with AG feedback on every training episode and an evaluation that must see none. The
    training tasks are the catalogue's first four (boiling): loading a task and its gold path
    takes 0.5-2 s for those, up to 15 s for others (mendelian-genetics)."""
    cfg = tiny_config(tmp_path, steps=2, **{"eval.every": 2, "eval.tasks": 2, "eval.max_turns": 2,
                                           "checkpoint.every": 2, "envs.train": "sciworld:train:4",
                                           "envs.eval": "sciworld", "envs.num_workers": 2,
                                           "rollout.max_turns": 2, "rollout.max_len": 4096,
                                           "rollout.tasks_per_step": 2, "rollout.group_size": 2,
                                           "feedback.schedule": "ag_early", "feedback.probability": 1.0})
    hist = train(cfg)["history"]
    assert len(hist) == 2
    for h in hist:
        assert h["rollout/infra_failures"] == 0
        assert h["rollout/env_steps"] >= 1 and np.isfinite(h["train/loss"])
        assert h["rollout/feedback_ag"] >= 4  # every episode's first observations got AG
    assert hist[1]["eval/feedback_ag"] == 0 and hist[1]["eval/feedback_oe"] == 0  # the standard env
    # BFCL episodes run through the pool in test_embedded_default_smoke's evaluation: its
    # prompts carry the function docs (2.5-4.5k tokens), and a train step on such rows, padded to
    # the 8 test devices, needs tens of GB on CPU.


def test_stepwise_representation_trains_one_row_per_turn(tmp_path, monkeypatch):
    """`rollout.representation = "stepwise"`: the loop trains on every model turn's row (the
    token count covers all rows, more than the last turn alone)."""
    from tests.train import toy_envs
    toy_envs.register(monkeypatch)
    cfg = tiny_config(tmp_path, steps=1, words=True, **{"eval.every": 0, "checkpoint.every": 1, "envs.train": "coin",
                                           "envs.eval": "coin", "rollout.max_turns": 3, "rollout.max_len": 256,
                                           "rollout.representation": "stepwise", "rollout.history_window": 1})
    h = train(cfg)["history"][0]
    assert h["rollout/env_steps"] > 1 and np.isfinite(h["train/loss"])
    # Every turn's row is trained on: the loss's token count is all rows' response tokens.
    episodes = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    assert h["train/tokens"] == pytest.approx(h["rollout/response_tokens"] * episodes)
    assert h["rollout/response_tokens"] > cfg.rollout.max_new_tokens  # more than one turn's worth


def test_mesh_devices_out_of_range_is_a_clear_error(tmp_path):
    from jaxscaffold.train.job import mesh_devices
    for n in (-1, 9):
        with pytest.raises(ValueError, match="mesh.devices"):
            mesh_devices(tiny_config(tmp_path, **{"mesh.devices": n}))
    assert mesh_devices(tiny_config(tmp_path, **{"mesh.devices": 8})) is None  # all of them


def test_env_kwargs_reach_the_envs_and_bad_json_is_a_clear_error(tmp_path):
    from jaxscaffold.config import typed
    from jaxscaffold.train.envs import make_envs
    cfg = typed(tiny_config(tmp_path, **{"envs.env_kwargs": '{"letters": {"win_share": 0.75}}'}))
    envs = make_envs(cfg, {"letters"})
    from jaxscaffold.envs import registry
    task = registry.catalogue("letters", "train")[0]
    envs.reset([task])
    assert envs.envs[0].win_share == 0.75
    envs.close()
    for bad in ("{not json", '["letters"]', '{"letters": 3}'):
        with pytest.raises(ValueError, match="env_kwargs"):
            typed(tiny_config(tmp_path, **{"envs.env_kwargs": bad}))


def test_dapo_overlong_penalty_counts_the_longest_turn():
    from jaxscaffold.rl.presets import preset
    from jaxscaffold.rollout.conversation import Conversation
    from jaxscaffold.train.update import shaped_rewards, turn_lengths
    from jaxscaffold.episodes.episode import Episode

    def episode(turns, reward):
        conv = Conversation()
        for n in turns:
            conv.add_context([1, 2, 3])
            conv.ids += [7] * n
            conv.assistant_mask += [1] * n
            conv.logprobs += [0.0] * n
        return Episode(task=None, group=0, conversation=conv, reward=reward)

    eps = [episode([10, 100], 1.0), episode([600, 20], 1.0), episode([1024], 0.0), episode([5], 0.0)]
    assert turn_lengths(eps[0].conversation) == [10, 100]
    dapo = preset("dapo")  # buffer 512 tokens, factor 1
    shaped, penalty = shaped_rewards(eps, dapo, max_new_tokens=1024)
    # zero up to 1024 - 512 tokens, then linear to -1 at the budget
    np.testing.assert_allclose(penalty, [0.0, -(600 - 512) / 512, -1.0, 0.0])
    np.testing.assert_allclose(shaped, [1.0, 1 - 88 / 512, -1.0, 0.0])
    plain, none = shaped_rewards(eps, preset("grpo"), max_new_tokens=1024)
    np.testing.assert_allclose(plain, [1, 1, 0, 0]) and np.testing.assert_allclose(none, 0)
    _, capped = shaped_rewards(eps, dapo, max_new_tokens=8)  # a budget under the buffer: capped
    np.testing.assert_allclose(capped, [-1, -1, -1, -(5 - 0) / 8])


@pytest.mark.parametrize("how", ["truncate", "delete"])
def test_export_of_a_damaged_checkpoint_is_one_line(two_step_run, tmp_path, how):
    """launch/export_hf.py on a damaged step: exit 2, one line naming the step and the others
    (it used to end 137 lines of Orbax traceback)."""
    import subprocess
    import sys
    copy_of(two_step_run, tmp_path)
    _damage_params(tmp_path / "checkpoints" / "2", how)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, os.path.join(root, "launch", "export_hf.py"), "--checkpoint", str(tmp_path),
                          "--out", str(tmp_path / "hf")], capture_output=True, text=True, timeout=600)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert "step 2" in lines[0] and "other steps: [1]" in lines[0]
