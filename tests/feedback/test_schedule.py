"""Truth tables of the feedback schedules, group-consistent randomisation and the bandit."""

import numpy as np
import pytest
from scipy import stats

from jaxscaffold.feedback import bandit, randomization, schedule


def table(s, kind, train_steps, episode_steps):
    return {(t, e) for t in train_steps for e in episode_steps if kind in s.active_kinds(t, e)}


def test_paper_default_truth_table():
    s = schedule.make("ag_early_oe_late")
    T, E = range(1, 201), range(0, 16)
    assert table(s, "ag", T, E) == {(t, e) for t in range(1, 101) for e in (0, 1, 2)}
    assert table(s, "oe", T, E) == {(t, e) for t in range(101, 201) for e in range(5, 10)}
    assert s.probability("ag", 100) == 0.5 and s.probability("ag", 101) == 0.0
    assert s.probability("oe", 100) == 0.0 and s.probability("oe", 101) == 0.5


def test_reference_code_bounds():
    s = schedule.make("ag_early_oe_late_reference")
    T, E = range(1, 201), range(0, 16)
    # AG when 0 <= steps_taken <= 3 and train_step <= 100; OE when 6 <= steps_taken <= 10 and > 100.
    assert table(s, "ag", T, E) == {(t, e) for t in range(1, 101) for e in range(0, 4)}
    assert table(s, "oe", T, E) == {(t, e) for t in range(101, 201) for e in range(6, 11)}


@pytest.mark.parametrize("name,kind,steps", [("ag_early", "ag", (0, 1, 2)), ("ag_late", "ag", (5, 6, 7, 8, 9)),
                                             ("oe_early", "oe", (0, 1, 2)), ("oe_late", "oe", (5, 6, 7, 8, 9))])
def test_pilot_grid_single_type_single_timing(name, kind, steps):
    s = schedule.make(name)
    other = "oe" if kind == "ag" else "ag"
    T, E = range(1, 201), range(0, 16)
    assert table(s, kind, T, E) == {(t, e) for t in T for e in steps}
    assert table(s, other, T, E) == set()


def test_none_is_the_standard_env():
    s = schedule.make("none")
    assert all(s.active_kinds(t, e) == () for t in range(1, 50) for e in range(20))


def test_annealing_decays_to_zero():
    s = schedule.make("ag_early", anneal=(50, 150))
    assert s.probability("ag", 50) == 0.5
    assert s.probability("ag", 100) == pytest.approx(0.25)
    assert s.probability("ag", 150) == 0.0 and s.active_kinds(150, 0) == ()


def test_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="unknown feedback schedule"):
        schedule.make("ag_sometimes")


def _decisions(mode, p=0.5, groups=400, group_size=8, step=7, seed=3):
    return np.array([[randomization.decide(mode, p, run_seed=seed, train_step=step, group_id=g, num_groups=groups,
                                           rollout=r, kind="ag") for r in range(group_size)] for g in range(groups)])


def test_group_consistency_and_probability_within_binomial_bound():
    d = _decisions("group", p=0.5)
    assert np.all(d == d[:, :1]), "every rollout of a group must get the same decision"
    k = int(d[:, 0].sum())
    assert stats.binomtest(k, d.shape[0], 0.5).pvalue > 1e-3
    d3 = _decisions("group", p=0.3, groups=1000)
    assert stats.binomtest(int(d3[:, 0].sum()), 1000, 0.3).pvalue > 1e-3


def test_inconsistent_and_reference_modes():
    d = _decisions("rollout")
    assert np.any(d != d[:, :1])  # differs inside groups
    assert stats.binomtest(int(d.sum()), d.size, 0.5).pvalue > 1e-3
    half = _decisions("first_half", groups=16)
    assert half[:8].all() and not half[8:].any()
    even = _decisions("even", groups=4)
    assert even[:, ::2].all() and not even[:, 1::2].any()


def test_decisions_are_deterministic_across_restarts_and_differ_across_steps():
    a, b = _decisions("group", step=11), _decisions("group", step=11)
    np.testing.assert_array_equal(a, b)
    assert np.any(_decisions("group", step=12)[:, 0] != a[:, 0])
    import subprocess, sys
    code = ("from jaxscaffold.feedback import randomization as r; "
            "print(''.join('1' if r.decide('group', 0.5, run_seed=3, train_step=11, group_id=g, num_groups=400, "
            "rollout=0, kind='ag') else '0' for g in range(400)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "".join("1" if x else "0" for x in a[:, 0])


def test_bandit_finds_the_best_arm_and_round_trips():
    rng = np.random.RandomState(0)
    truth = {"none": 0.1, "ag_early": 0.7, "ag_late": 0.3, "oe_early": 0.2, "oe_late": 0.4}
    state = bandit.BanditState.create(discount=0.99)
    picks = []
    for step in range(1, 201):
        arms = [bandit.choose(state, run_seed=0, train_step=step, group_id=g) for g in range(16)]
        picks += arms if step > 150 else []
        state = bandit.update(state, [(a, float(rng.rand() < truth[a])) for a in arms])
    share = picks.count("ag_early") / len(picks)
    assert share > 0.6, share
    assert bandit.BanditState.from_dict(state.to_dict()) == state


def test_bandit_follows_a_change_in_the_best_arm():
    """AG useful early, OE late: the discounted bandit switches."""
    rng = np.random.RandomState(1)
    state = bandit.BanditState.create(arms=("ag_early", "oe_late"), discount=0.9)
    late = []
    for step in range(1, 201):
        best = "ag_early" if step <= 100 else "oe_late"
        arms = [bandit.choose(state, run_seed=0, train_step=step, group_id=g) for g in range(16)]
        if step > 170:
            late += arms
        state = bandit.update(state, [(a, float(rng.rand() < (0.8 if a == best else 0.2))) for a in arms])
    assert late.count("oe_late") / len(late) > 0.7

