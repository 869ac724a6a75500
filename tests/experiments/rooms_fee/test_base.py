"""experiments/rooms_fee/base.py's teacher rows: the rollout's step-wise format, the loss on the action
alone, actions from the listed ones, and the hinted action followed where a hint is shown; the
base fitted through the package's trainer taking the steps of a plain SFT loop; and
experiments/rooms_fee/measure.py's one-line errors."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from jaxscaffold.envs import rooms
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.train.vocabularies import word_tokenizer
from tests.experiments.rooms_fee import script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _rows(seed, **probs):
    tok = word_tokenizer("rooms")
    rows = script("base").base_rows(rooms.RoomsEnv(), rooms.catalogue("train")[seed], Qwen3ChatRenderer(tok),
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
    for name, args in (("base.py", [str(tmp_path / "b"), "--hint", "0.8", "--oe", "0.5"]),
                       ("measure.py", [str(tmp_path), "--episodes", "3"])):
        run = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "rooms_fee", name), *args], capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 2 and run.stderr.strip().count("\n") == 0 and "error" in run.stderr


def test_a_base_of_a_given_size_saves_its_steps_and_continues_from_one(tmp_path):
    """--hidden / --layers size the model, --save-every writes intermediate bases, and --init
    continues from one (here with the cosine schedule): each output loads as an HF directory."""
    from jaxscaffold.models import hf_io
    main = script("base").main
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


@pytest.mark.slow
def test_the_base_through_the_trainer_takes_the_steps_of_a_plain_sft_loop(tmp_path):
    """The trainer's `sft` workload fed by the teacher (`base.Teacher`) against the loop the
    script ran before: the same seeded init, teacher rows and optimizer step by step; the 8
    losses agree to 1e-5 and the exported base to 5e-5 (below)."""
    import jax

    from jaxscaffold.models import config as model_configs
    from jaxscaffold.models import hf_io, qwen3
    from jaxscaffold.models.word_tokenizer import padded_vocab_size
    from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_sft_step
    from jaxscaffold.train.batching import build_batch

    base = script("base")
    steps, batch, turns, seed, lr = 8, 4, 14, 3, 3e-3
    out = tmp_path / "base"
    assert base.main([str(out), "--steps", str(steps), "--batch", str(batch), "--seed", str(seed)]) == 0
    with open(out / "run" / "metrics.jsonl") as f:
        losses = [m["train/loss"] for m in map(json.loads, f) if "train/loss" in m]
    # The loop, written out: the default size's seeded init, constant-lr AdamW without decay,
    # `batch` rows a step sampled from a pool of whole teacher episodes.
    tok = word_tokenizer("rooms")
    chat = Qwen3ChatRenderer(tok)
    config = model_configs.tiny(vocab_size=padded_vocab_size(tok), hidden_size=64, intermediate_size=192,
                                num_layers=2, num_heads=4, num_kv_heads=2, compute_dtype="float32",
                                remat_policy="none")
    opt = OptimizerConfig(lr=lr, weight_decay=0.0)
    state = init_train_state(qwen3.init_params(config, jax.random.key(seed)), opt.make())
    step = make_sft_step(config, opt)
    rng, env, tasks, loop = random.Random(seed), rooms.RoomsEnv(), rooms.catalogue("train"), []
    for _ in range(steps):
        pool = []
        while len(pool) < batch:
            pool += base.base_rows(env, rng.choice(tasks), chat, rng, turns, **base.TEACHER)
        convs = rng.sample(pool, batch)
        state, metrics = step(state, build_batch(convs, np.zeros(batch)))
        loop.append(float(metrics["loss"]))
    assert len(losses) == steps
    np.testing.assert_allclose(losses, loop, rtol=0, atol=1e-5)
    # Adam divides by the root of the second moment, so a rounding difference in a near-zero
    # gradient can move a weight by up to lr (3e-3) a step: on an AMD EPYC one weight of 24,576
    # differed by 1.2e-5 (1e-5 passed on an Intel Xeon). A weight moves by up to lr x steps (2.4e-2),
    # so 5e-5 still catches any step taken differently.
    _, exported = hf_io.load_pretrained(str(out))
    for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(jax.device_get(state.params))):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=0, atol=5e-5)


def _leaves_differ(a, b) -> bool:
    import jax
    import numpy as np
    return any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))



@pytest.mark.slow
def test_an_interrupted_build_continues_to_the_uninterrupted_base(tmp_path, monkeypatch):
    """A build stopped after a checkpoint and rerun with the same command continues from it
    (the teacher's generator restored with the weights and optimizer) and ends with the base
    of a build that never stopped."""
    import jax
    import pytest
    from jaxscaffold.models import hf_io
    base = script("base")
    args = ["--steps", "4", "--batch", "4", "--hidden", "32", "--layers", "1", "--checkpoint-every", "2"]
    assert base.main([str(tmp_path / "whole"), *args]) == 0
    _, whole = hf_io.load_pretrained(str(tmp_path / "whole"))

    batch = base.Teacher.batch

    def stop_at_step_3(self, step):  # the interruption: the process ends after step 2's checkpoint
        if step >= 3:
            raise KeyboardInterrupt
        return batch(self, step)

    monkeypatch.setattr(base.Teacher, "batch", stop_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        base.main([str(tmp_path / "cut"), *args])
    monkeypatch.setattr(base.Teacher, "batch", batch)
    assert not (tmp_path / "cut" / "config.json").exists()
    calls = []
    monkeypatch.setattr(base.Teacher, "batch", lambda self, step: calls.append(step) or batch(self, step))
    assert base.main([str(tmp_path / "cut"), *args]) == 0
    assert min(calls) == 3  # continued, not rebuilt from step 1
    _, resumed = hf_io.load_pretrained(str(tmp_path / "cut"))
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=0, atol=1e-6)
