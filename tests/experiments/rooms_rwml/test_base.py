"""experiments/rooms_rwml/base.py's warm-up batches: both kinds of example, and no next-state knowledge.

The base must keep acting (policy rows: the rooms base's own step-wise teacher rows) and
learn the answer format from targets that carry nothing of the dynamics (copy rows: the current
state in `<next_state>` tags, never the true next state, which would make every arm WM-SFT)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import random

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


def test_bad_copy_tasks_is_a_one_line_error(capsys):
    assert _script().main(["unused_base", "unused_out", "--copy-tasks", "0"]) == 2
    assert "--copy-tasks" in capsys.readouterr().err
