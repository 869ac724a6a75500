"""The `lines` reward on real rooms transitions: the true next state (its lines in any order)
scores 1; the outcome of every *other* valid action from the same state (computed by the env
itself), and the unchanged current state where the action changed it, score 0; an answer
without the tags scores the maximum distance."""

import os
import random

import numpy as np
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.envs import rooms
from jaxscaffold.worldmodel import line_reward, reward

TAU_D = 0.01  # configs/rwml_rooms.py
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def _transitions(n_tasks=6, steps=10):
    """(state text, action, next text, the texts every other valid action leads to)."""
    rng, out = random.Random(0), []
    for task in rooms.catalogue("train")[:n_tasks]:
        world, _ = rooms.generate(task.spec["seed"])
        state = rooms.initial_state(world)
        for _ in range(steps):
            actions = rooms.valid_actions(world, state)
            action = rng.choice(actions)
            nxt = rooms.apply(world, state, action)
            others = {rooms.describe(world, rooms.apply(world, state, a)) for a in actions if a != action}
            out.append((rooms.describe(world, state), action, rooms.describe(world, nxt), others))
            state = nxt
            if rooms.goal_done(world, state):
                break
    return out


def _tagged(text):
    return f"<next_state>{text}</next_state>"


def test_true_states_pass_and_every_other_outcome_fails():
    transitions = _transitions()
    truth = [t for _, _, t, _ in transitions]
    shuffled = ["\n".join(random.Random(i).sample(t.splitlines(), len(t.splitlines()))) for i, t in enumerate(truth)]
    r, d, _ = line_reward.line_rewards_with_counts([_tagged(s) for s in shuffled], truth, TAU_D)
    assert r.tolist() == [1.0] * len(truth) and d.max() == 0.0
    misses, targets = [], []
    for _, _, t, others in transitions:
        for o in others - {t}:
            misses.append(_tagged(o))
            targets.append(t)
    assert len(misses) > 100
    r, d, _ = line_reward.line_rewards_with_counts(misses, targets, TAU_D)
    assert r.sum() == 0 and d.min() > 0.05  # one line of <= 9 wrong is a distance >= 1/9
    copies = [(_tagged(s), t) for s, _, t, _ in transitions]
    r, _, _ = line_reward.line_rewards_with_counts(*zip(*copies), TAU_D)
    assert r.tolist() == [float(s == t) for s, _, t, _ in transitions]


def test_distance_is_the_share_of_differing_lines():
    target = "a\nb\nc\nd"
    assert line_reward.line_distance("a\nb\nc\nd", target) == 0.0
    assert line_reward.line_distance("  a \n\nb\nc\nd\n", target) == 0.0  # whitespace and blank lines
    assert line_reward.line_distance("a\nb\nc\nx", target) == pytest.approx(0.25)
    assert line_reward.line_distance("a\nb", target) == pytest.approx(0.5)  # a missing tail counts
    assert line_reward.line_distance("a\nb\nc\nd\ne\nf\ng\nh", target) == pytest.approx(0.5)  # so does an extra one
    assert line_reward.line_distance("a\na\nb\nc", target) == pytest.approx(0.25)  # lines are a multiset
    r, d, counts = line_reward.line_rewards_with_counts(["a\nb\nc\nd", "<next_state>a</next_state><next_state>"],
                                                        [target, target], 0.5)
    assert r.tolist() == [0.0, 0.0] and np.all(d == reward.MAX_DISTANCE) and counts == {}


def test_the_lines_reward_needs_no_embedder_or_judge():
    cd = config_lib.load_file(config_lib.config_path("rwml_rooms.py", CONFIGS))
    cfg = config_lib.from_configdict(config_lib.parse_overrides(cd, ["rwml.judge_path=", "rwml.embedder=qwen3"]))
    assert cfg.rwml.reward == "lines"
    with pytest.raises(config_lib.ConfigError, match="lines"):
        config_lib.from_configdict(config_lib.parse_overrides(cd, ["rwml.reward=exact"]))
    with pytest.raises(config_lib.ConfigError, match="judge_path"):
        config_lib.from_configdict(config_lib.parse_overrides(cd, ["rwml.reward=judge_binary"]))
