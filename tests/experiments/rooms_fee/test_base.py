"""experiments/rooms_fee/base.py's teacher rows: the rollout's step-wise format, the loss on the action
alone, actions from the listed ones, and the hinted action followed where a hint is shown; and
experiments/rooms_fee/measure.py's one-line errors."""

import importlib.util
import os
import random
import subprocess
import sys

from jaxscaffold.envs import rooms
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.train.vocabularies import word_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _module(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "experiments", "rooms_fee", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(seed, **probs):
    tok = word_tokenizer("rooms")
    rows = _module("base").base_rows(rooms.RoomsEnv(), rooms.catalogue("train")[seed], Qwen3ChatRenderer(tok),
                                           random.Random(seed), 14, **probs)
    return tok, rows


def _parts(tok, row):
    """(prompt text, trained text) of a row, split by its loss mask."""
    ids, mask = row.ids, row.assistant_mask
    return tok.decode([i for i, m in zip(ids, mask) if not m]), tok.decode([i for i, m in zip(ids, mask) if m])


def test_unguided_rows_take_a_listed_action_and_train_on_it_alone():
    for seed in range(4):
        tok, rows = _rows(seed, hint=0.0, follow=1.0, oe=0.0)
        assert 1 <= len(rows) <= 14
        for k, row in enumerate(rows):
            prompt, target = _parts(tok, row)
            assert target.endswith("<|im_end|>") and row.assistant_mask[-1] == 1
            action = target[: -len("<|im_end|>")].split("</think>")[-1].strip()
            listed = prompt.rsplit("Actions: ", 1)[1].split("<|im_end|>")[0].split("\n")[0].split("; ")
            assert action in listed and "Hint:" not in prompt
            # After the first turn the step-wise prompt shows the task (the first observation) and the current one.
            assert prompt.count("Goal:") == (1 if k == 0 else 2)


def test_always_followed_hints_walk_the_shortest_plan():
    for seed in range(4):
        tok, rows = _rows(seed, hint=1.0, follow=1.0, oe=0.0)
        _, plan = rooms.generate(int(rooms.catalogue("train")[seed].spec["seed"]))
        assert len(rows) == len(plan)  # the planner's hints reach the goal in a shortest plan's length
        for row in rows:
            prompt, target = _parts(tok, row)
            hint = prompt.rsplit("Hint: ", 1)[1].split("<|im_end|>")[0].strip()
            assert target.split("</think>")[-1].strip() == f"{hint}<|im_end|>"


def test_bad_arguments_are_one_line_errors(tmp_path):
    for script, args in (("base.py", [str(tmp_path / "b"), "--hint", "0.8", "--oe", "0.5"]),
                         ("measure.py", [str(tmp_path), "--episodes", "3"])):
        run = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "rooms_fee", script), *args], capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 2 and run.stderr.strip().count("\n") == 0 and "error" in run.stderr


def test_a_base_of_a_given_size_saves_its_steps_and_continues_from_one(tmp_path):
    """--hidden / --layers size the model, --save-every writes intermediate bases, and --init
    continues from one (here with the cosine schedule): each output loads as an HF directory."""
    from jaxscaffold.models import hf_io
    main = _module("base").main
    first = tmp_path / "first"
    assert main([str(first), "--steps", "2", "--batch", "4", "--hidden", "32", "--layers", "1", "--save-every", "1"]) == 0
    config, params = hf_io.load_pretrained(str(first / "step_1"))
    assert (config.hidden_size, config.num_layers, config.num_heads) == (32, 1, 2)
    _, final = hf_io.load_pretrained(str(first))
    assert _leaves_differ(params, final)  # step 2 trained on
    assert main([str(tmp_path / "more"), "--init", str(first), "--steps", "1", "--batch", "4", "--cosine"]) == 0
    config2, more = hf_io.load_pretrained(str(tmp_path / "more"))
    assert config2.hidden_size == 32 and _leaves_differ(final, more)
    assert main([str(tmp_path / "bad"), "--hidden", "40"]) == 2


def _leaves_differ(a, b) -> bool:
    import jax
    import numpy as np
    return any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))



def test_an_interrupted_build_continues_to_the_uninterrupted_base(tmp_path, monkeypatch, capsys):
    """A build stopped after a checkpoint (OUT_DIR/resume) and rerun with the same command ends
    with the same weights, bit for bit, as one that never stopped; the resume state is removed
    at the end; a rerun with other arguments over it is a one-line error."""
    import pytest
    from jaxscaffold.models import hf_io
    base = _module("base")
    args = ["--steps", "4", "--batch", "4", "--hidden", "32", "--layers", "1", "--checkpoint-every", "2"]
    assert base.main([str(tmp_path / "whole"), *args]) == 0
    _, whole = hf_io.load_pretrained(str(tmp_path / "whole"))
    assert not (tmp_path / "whole" / "resume").exists()

    save = base.save_resume

    def save_then_stop(*a):  # the interruption: the process ends right after step 2's checkpoint
        save(*a)
        raise KeyboardInterrupt

    for out in ("cut", "other"):
        monkeypatch.setattr(base, "save_resume", save_then_stop)
        with pytest.raises(KeyboardInterrupt):
            base.main([str(tmp_path / out), *args])
        monkeypatch.setattr(base, "save_resume", save)
        assert (tmp_path / out / "resume" / "meta.json").exists()
    capsys.readouterr()
    assert base.main([str(tmp_path / "cut"), *args]) == 0
    assert "continuing from step 2" in capsys.readouterr().out  # not a fresh build that happens to agree
    _, resumed = hf_io.load_pretrained(str(tmp_path / "cut"))
    assert not _leaves_differ(whole, resumed)
    assert not (tmp_path / "cut" / "resume").exists()
    assert base.main([str(tmp_path / "other"), *args, "--lr", "1e-3"]) == 2
