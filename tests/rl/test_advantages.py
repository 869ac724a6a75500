"""Advantage estimators against the plain-loop NumPy reference, and their defining properties."""

import numpy as np
import pytest

from jaxscaffold.rl.advantages import ESTIMATORS, advantages, informative
from jaxscaffold.rl.presets import preset
from tests.rl import numpy_reference as ref


def algo(estimator: str = "grpo", **overrides):
    """The algorithm whose advantages a test computes: GRPO's preset with this estimator."""
    return preset("grpo", estimator=estimator, **overrides)


# Groups of 1, 2, 3 and 5 rollouts, interleaved in the batch, with string ids.
GROUPS = np.array(["a", "b", "c", "b", "d", "c", "d", "d", "c", "d", "d"])
REWARDS = np.array([0.7, 1.0, 0.0, 0.0, 3.0, 1.0, -1.0, 0.5, 1.0, 2.0, 0.0])


@pytest.mark.parametrize("batch_norm", [False, True])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_estimators_match_reference(estimator, batch_norm):
    got = advantages(REWARDS, GROUPS, algo(estimator), batch_norm=batch_norm)
    want = ref.advantages(list(REWARDS), list(GROUPS), estimator, batch_norm=batch_norm)
    assert got.dtype == np.float32 and got.shape == REWARDS.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_unbiased_std_by_hand():
    # Group [0, 1]: mean 0.5, unbiased std sqrt(0.5) (the biased one would be 0.5).
    adv = advantages([0.0, 1.0], [0, 0], algo())
    np.testing.assert_allclose(adv, [-0.5 / (np.sqrt(0.5) + 1e-6), 0.5 / (np.sqrt(0.5) + 1e-6)], rtol=1e-6)
    adv = advantages([1.0, 2.0, 6.0], [0, 0, 0], algo(), eps=0.0)
    np.testing.assert_allclose(adv, (np.array([1, 2, 6]) - 3) / np.std([1, 2, 6], ddof=1), rtol=1e-6)


def test_group_of_one_keeps_the_raw_reward():
    for est in ESTIMATORS:
        adv = advantages([0.7, 1.0, 0.0], ["solo", "pair", "pair"], algo(est))
        assert adv[0] == np.float32(0.7), est


def test_drgrpo_is_grpo_without_std_and_rloo_is_leave_one_out():
    r, g = REWARDS, GROUPS
    np.testing.assert_array_equal(advantages(r, g, algo("drgrpo")), advantages(r, g, algo("grpo", norm_std=False)))
    rloo = advantages([1.0, 2.0, 6.0], [0, 0, 0], algo("rloo"))
    np.testing.assert_allclose(rloo, [1 - 4, 2 - 3.5, 6 - 1.5], rtol=1e-6)
    # RLOO = n/(n-1) times the mean-centred score.
    np.testing.assert_allclose(rloo, 1.5 * advantages([1.0, 2.0, 6.0], [0, 0, 0], algo("drgrpo")), rtol=1e-6)


def test_all_equal_group_gives_zero():
    for est in ESTIMATORS:
        adv = advantages([1.0, 1.0, 1.0, 0.0, 1.0], [0, 0, 0, 1, 1], algo(est))
        assert np.all(adv[:3] == 0), est


def test_batch_norm_z_scores_over_the_batch():
    adv = advantages(REWARDS, GROUPS, algo("drgrpo"), batch_norm=True, eps=0.0)
    np.testing.assert_allclose(adv.mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(adv.std(ddof=1), 1.0, rtol=1e-6)


# Step-wise rows: trajectories of 3, 1, 2 (group g0) and 4, 1 (group g1) steps, rows shuffled.
STEP_TRAJ = np.array([0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 4])
STEP_GROUP = np.array(["g0"] * 6 + ["g1"] * 5)
TRAJ_REWARD = {0: 1.0, 1: 0.0, 2: 0.0, 3: 1.0, 4: 0.0}
PERM = np.random.RandomState(0).permutation(len(STEP_TRAJ))


@pytest.mark.parametrize("batch_norm", [False, True])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_step_rows_count_each_trajectory_once(estimator, batch_norm):
    traj, group = STEP_TRAJ[PERM], STEP_GROUP[PERM]
    rewards = np.array([TRAJ_REWARD[t] for t in traj])
    got = advantages(rewards, group, algo(estimator), traj_ids_N=traj, count="trajectory", batch_norm=batch_norm)
    want = ref.advantages(list(rewards), list(group), estimator, batch_norm=batch_norm, traj_ids=list(traj))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # Same as one row per trajectory, broadcast to its steps.
    per_traj = advantages(list(TRAJ_REWARD.values()), ["g0", "g0", "g0", "g1", "g1"], algo(estimator), batch_norm=batch_norm)
    np.testing.assert_allclose(got, per_traj[traj], rtol=1e-6)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_step_rows_count_every_row(estimator):
    traj, group = STEP_TRAJ[PERM], STEP_GROUP[PERM]
    rewards = np.array([TRAJ_REWARD[t] for t in traj])
    got = advantages(rewards, group, algo(estimator), traj_ids_N=traj, count="row")
    want = ref.advantages(list(rewards), list(group), estimator, traj_ids=list(traj), count="row")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got, advantages(rewards, group, algo(estimator)))  # rows as trajectories
    # Long episodes weigh more when rows are counted, so the two options really differ.
    by_traj = advantages(rewards, group, algo(estimator), traj_ids_N=traj, count="trajectory")
    assert not np.allclose(got, by_traj)
    # Rows of one trajectory still share one advantage.
    for t in TRAJ_REWARD:
        assert len(set(got[traj == t].tolist())) == 1


def test_inconsistent_trajectory_rewards_raise():
    with pytest.raises(ValueError, match="trajectory 7 has rows with different rewards"):
        advantages([1.0, 1.0, 0.0], [0, 0, 0], algo(), traj_ids_N=[7, 7, 7])
    with pytest.raises(ValueError, match="different groups"):
        advantages([1.0, 1.0], [0, 1], algo(), traj_ids_N=[3, 3])
    with pytest.raises(ValueError, match="different rewards"):
        advantages([1.0, 0.5], [0, 0], algo(), traj_ids_N=[3, 3], count="row")  # checked whatever the count


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match=r"estimator='ppo' is not one of \('grpo', 'drgrpo', 'rloo'\)"):
        advantages([1.0], [0], algo("ppo"))  # the algorithm refuses an unknown estimator
    with pytest.raises(ValueError, match="unknown count"):
        advantages([1.0], [0], algo(), count="step")
    with pytest.raises(ValueError, match="must be equal 1-D"):
        advantages([1.0, 2.0], [0], algo())
    with pytest.raises(ValueError, match="traj ids"):
        advantages([1.0, 2.0], [0, 0], algo(), traj_ids_N=[1])


def test_informative_signal():
    """The one definition of an informative group (the bandit's signal, the rollout metrics and
    DAPO's filter use it): more than one value, not all equal, exactly when an estimator's
    group-relative advantages are not all zero."""
    assert informative([0, 0, 0]) == 0.0 and informative([0, 1, 0]) == 1.0
    assert informative([1.0]) == 0.0
    assert informative(np.asarray([True, False])) and not informative([0.5, 0.5])
    rng = np.random.default_rng(0)
    for _ in range(20):
        g = rng.integers(0, 2, size=int(rng.integers(2, 6))).astype(float)
        for estimator in ESTIMATORS:
            adv = advantages(g, np.zeros(len(g), int), algo(estimator))
            assert informative(g) == bool(np.any(adv != 0)), (g, estimator)
