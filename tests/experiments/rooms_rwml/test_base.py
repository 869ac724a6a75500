"""experiments/rooms_rwml/base.py's warm-up batches: both kinds of example, and no next-state knowledge.

The base must keep acting (policy rows: the rooms base's own step-wise teacher rows) and
learn the answer format from targets that carry nothing of the dynamics (copy rows: the current
state in `<next_state>` tags, never the true next state, which would make every arm WM-SFT); and
the warm-up run through the package's trainer taking the steps of a plain SFT loop."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random

import pytest

from jaxscaffold.envs import rooms
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.train.vocabularies import word_tokenizer
from jaxscaffold.worldmodel import task as task_lib
from jaxscaffold.worldmodel import triples as triples_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _script():
    spec = importlib.util.spec_from_file_location("rooms_wm_base", os.path.join(ROOT, "experiments", "rooms_rwml", "base.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _changing_step(task):
    """(observation, action, next observation) of the first listed action that changes the state."""
    for action in rooms.RoomsEnv().reset(task).privileged["valid_actions"]:
        env = rooms.RoomsEnv()
        obs = env.reset(task)
        nxt = env.step(action).observation.text
        if nxt.strip() != obs.text.strip():
            return obs.text, action, nxt
    raise AssertionError("no action changes the state")


def test_mixed_batch_keeps_both_kinds_and_copies_only_the_current_state():
    script, rng = _script(), random.Random(0)
    tok = word_tokenizer("rooms_wm")
    chat = Qwen3ChatRenderer(tok)
    task = rooms.catalogue("train")[0]
    obs, action, nxt = _changing_step(task)
    true = triples_lib.from_trajectory("rooms", task.task_id, [obs, nxt], [action])
    copies = [dataclasses.replace(t, next_state=t.observation) for t in true]
    pcfg = task_lib.PromptConfig(history_window=1, max_chars=2000)
    convs = script.mixed_batch(chat, copies, pcfg, rooms.RoomsEnv(), rooms.catalogue("train")[:8], rng,
                               batch=8, policy_share=0.5)
    answers = [tok.decode([i for i, m in zip(c.ids, c.assistant_mask) if m]) for c in convs]
    wm = [a for a in answers if "<next_state>" in a]
    assert len(convs) == 8 and len(wm) == 4
    assert all(a.strip() for a in answers)  # policy rows supervise their actions
    for conv, answer in zip(convs, answers):
        if "<next_state>" not in answer:  # a step-wise row: the task and at most the current observation
            prompt = tok.decode([i for i, m in zip(conv.ids, conv.assistant_mask) if not m])
            listed = prompt.rsplit("Actions: ", 1)[1].split("\n")[0].split("<|im_end|>")[0].split("; ")
            assert prompt.count("Goal:") <= 2 and answer.split("</think>")[-1].replace("<|im_end|>", "").strip() in listed
    for a in wm:
        state = task_lib.parse_prediction(a.replace("<|im_end|>", ""))
        assert state == obs.strip() and state != nxt.strip()


def _rwml_rooms_config():
    from jaxscaffold import config as config_lib

    cd = config_lib.load_file(config_lib.config_path("rwml_rooms.py", os.path.join(ROOT, "configs")))
    return config_lib.from_configdict(config_lib.parse_overrides(cd, ["mesh.devices=1"]))


def test_copy_triples_come_from_as_many_train_layouts_as_asked_and_copy_the_state():
    # --copy-tasks: the warm-up's variety (268 triples of 24 layouts were memorised, not copied).
    script, cfg = _script(), _rwml_rooms_config()
    few, more = script.copy_triples(cfg, "train", 3, 0), script.copy_triples(cfg, "train", 12, 0)
    train_ids = {t.task_id for t in rooms.catalogue("train")}
    assert len({t.task_id for t in few}) == 3 and len({t.task_id for t in more}) == 12
    assert {t.task_id for t in more} <= train_ids and len(more) > len(few)
    assert all(t.next_state == t.observation for t in few + more)


def test_true_next_state_triples_are_the_env_transitions_the_copies_replace():
    # --targets next (experiments/rooms_rwml/premise.py's warm-up): the same transitions, true targets.
    script, cfg = _script(), _rwml_rooms_config()
    copies, true = script.copy_triples(cfg, "train", 3, 0), script.copy_triples(cfg, "train", 3, 0, copy=False)
    assert [(t.observation, t.action) for t in copies] == [(t.observation, t.action) for t in true]
    assert any(t.next_state != t.observation for t in true)
    env, task = rooms.RoomsEnv(), {t.task_id: t for t in rooms.catalogue("train")}[true[0].task_id]
    assert env.reset(task).text.strip() == true[0].observation.strip()
    assert env.step(true[0].action).observation.text.strip() == true[0].next_state.strip()


def test_bad_copy_tasks_is_a_one_line_error(capsys):
    assert _script().main(["unused_base", "unused_out", "--copy-tasks", "0"]) == 2
    assert "--copy-tasks" in capsys.readouterr().err


@pytest.mark.slow
def test_the_warm_up_through_the_trainer_takes_the_steps_of_a_plain_sft_loop(tmp_path):
    """The trainer's `sft` workload fed by `WarmUp` against the warm-up loop the script ran
    before: the same moved model, mixed batches and optimizer step by step; the 8 losses and
    the written base agree to 1e-5."""
    import jax
    import numpy as np

    from jaxscaffold import config as config_lib
    from jaxscaffold.models import config as model_configs
    from jaxscaffold.models import hf_io, qwen3
    from jaxscaffold.models.sharding import shard_batch
    from jaxscaffold.models.word_tokenizer import padded_vocab_size
    from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_sft_step
    from jaxscaffold.train.batching import build_batch
    from jaxscaffold.train.job import build_job
    from jaxscaffold.train.workloads.world_model import prompt_config

    script, words = _script(), word_tokenizer("rooms")
    config = model_configs.tiny(vocab_size=padded_vocab_size(words), compute_dtype="float32", remat_policy="none")
    rooms_base = str(tmp_path / "rooms_base")  # a seeded random model on the rooms words stands in for the base
    hf_io.save_pretrained(rooms_base, config, jax.device_get(qwen3.init_params(config, jax.random.key(0))),
                          tokens=hf_io.SpecialTokens.of(words))
    steps, batch, seed, lr, copy_tasks = 8, 4, 1, 2e-3, 3
    common = ["--batch", str(batch), "--seed", str(seed), "--lr", str(lr), "--copy-tasks", str(copy_tasks),
              "--no-check"]
    out, moved = tmp_path / "base", tmp_path / "moved"
    assert script.main([rooms_base, str(out), "--warmup-steps", str(steps), *common]) == 0
    with open(out / "run" / "metrics.jsonl") as f:
        losses = [m["train/loss"] for m in map(json.loads, f) if "train/loss" in m]
    assert script.main([rooms_base, str(moved), "--warmup-steps", "0", *common]) == 0  # the moved model alone
    # The loop, written out: AdamW at a constant lr without decay on the stage-1 job's step.
    cd = config_lib.load_file(config_lib.config_path("rwml_rooms.py", os.path.join(ROOT, "configs")))
    cfg = config_lib.from_configdict(config_lib.parse_overrides(
        cd, [f"model.hf_path={moved}", f"seed={seed}", "mesh.devices=1"]))
    job, state = build_job(cfg)
    opt = OptimizerConfig(lr=lr, weight_decay=0.0, grad_clip=cfg.rl.grad_clip)
    step = make_sft_step(job.model_config, opt, num_micro_batches=cfg.rl.micro_batches, mesh=job.mesh)
    state = init_train_state(state.params, opt.make())
    triples = script.copy_triples(cfg, "train", copy_tasks, seed)
    chat, pcfg = Qwen3ChatRenderer(job.tokenizer), prompt_config(cfg)
    env, tasks, rng, loop = rooms.RoomsEnv(), rooms.catalogue("train"), random.Random(seed), []
    for _ in range(steps):
        convs = script.mixed_batch(chat, triples, pcfg, env, tasks, rng, batch=batch, policy_share=0.5)
        arrays = build_batch(convs, np.zeros(len(convs)), row_multiple=job.row_multiple)
        state, metrics = step(state, arrays if job.mesh is None else shard_batch(arrays, job.mesh))
        loop.append(float(metrics["loss"]))
    assert len(losses) == steps
    np.testing.assert_allclose(losses, loop, rtol=0, atol=1e-5)
    _, written = hf_io.load_pretrained(str(out))
    for a, b in zip(jax.tree.leaves(written), jax.tree.leaves(jax.device_get(state.params))):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=0, atol=1e-5)
