"""The update's per-row advantages (`update.row_advantages`) against the plain-loop NumPy
reference: step-wise episodes of different lengths, group statistics per trajectory or per row,
and `rl.overlong_buffer` setting DAPO's shaping (0: off) whatever the preset says."""

import numpy as np
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.rl.presets import preset
from jaxscaffold.rollout.conversation import Conversation
from jaxscaffold.train.update import row_advantages
from tests.rl import numpy_reference as ref


def _episode(group, reward, turns):
    rows = []
    for _ in range(turns):
        conv = Conversation()
        conv.add_context([1, 2, 3])
        conv.ids += [7, 8]
        conv.assistant_mask += [1, 1]
        conv.logprobs += [0.0, 0.0]
        rows.append(conv)
    return Episode(task=None, group=group, conversation=Conversation(), reward=reward, rows=rows)


# Two groups; episodes of 1-5 step rows, so counting rows weighs the long ones more.
EPISODES = [(0, 1.0, 5), (0, 0.0, 1), (0, 0.0, 2), (0, 1.0, 1), (1, 0.5, 3), (1, 0.0, 4), (1, 1.0, 1)]


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo"])
@pytest.mark.parametrize("group_stats", ["trajectory", "row"])
def test_row_advantages_match_the_numpy_reference(algorithm, group_stats):
    eps = [_episode(*e) for e in EPISODES]
    rewards = np.array([e.reward for e in eps])
    algo = preset(algorithm)
    got = row_advantages(eps, rewards, algo, group_stats)
    traj = [i for i, e in enumerate(eps) for _ in e.rows]
    want = ref.advantages([eps[i].reward for i in traj], [eps[i].group for i in traj], algo.estimator,
                          norm_std=algo.norm_std, traj_ids=traj, count=group_stats)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert len(got) == sum(n for *_, n in EPISODES)


def test_row_statistics_differ_from_trajectory_statistics_by_hand():
    """Group 0 above by hand: rows 1,1,1,1,1,0,0,0,1 (mean 6/9) against trajectories 1,0,0,1 (mean 1/2)."""
    eps = [_episode(*e) for e in EPISODES[:4]]
    rewards = np.array([e.reward for e in eps])
    by_row = row_advantages(eps, rewards, preset("drgrpo"), "row")
    by_traj = row_advantages(eps, rewards, preset("drgrpo"), "trajectory")
    np.testing.assert_allclose(by_row[:5], 1 - 6 / 9, rtol=1e-6)
    np.testing.assert_allclose(by_row[5], -6 / 9, rtol=1e-6)
    np.testing.assert_allclose(by_traj[:5], 0.5) and np.testing.assert_allclose(by_traj[5], -0.5)


def test_overlong_buffer_and_group_stats_are_config_fields(tmp_path):
    base = config_lib.load_file("configs/base.py")
    cfg = config_lib.from_configdict(base)
    assert (cfg.rl.overlong_buffer, cfg.rl.group_stats) == (0, "trajectory")  # off: the reference's DAPO
    cfg = config_lib.from_configdict(config_lib.parse_overrides(base, ["rl.overlong_buffer=512", "rl.group_stats=row"]))
    assert (cfg.rl.overlong_buffer, cfg.rl.group_stats) == (512, "row")
    with pytest.raises(config_lib.ConfigError, match="overlong_buffer"):
        config_lib.validate(config_lib.from_configdict(config_lib.parse_overrides(base, ["rl.overlong_buffer=-1"])))
    with pytest.raises(config_lib.ConfigError, match="group_stats"):
        config_lib.from_configdict(config_lib.parse_overrides(base, ["rl.group_stats=episode"]))


def test_the_job_takes_dapo_overlong_shaping_from_the_config(tmp_path):
    """A DAPO run has no overlong shaping unless rl.overlong_buffer sets it (the preset's 512 is
    the DAPO paper's reading, not the reference's)."""
    from jaxscaffold.train.job import build_job
    from tests.train.configs import tiny_config
    off, _ = build_job(tiny_config(tmp_path / "off", **{"rl.algorithm": "dapo"}))
    on, _ = build_job(tiny_config(tmp_path / "on", **{"rl.algorithm": "dapo", "rl.overlong_buffer": 512}))
    assert off.algo.overlong_buffer is None and on.algo.overlong_buffer == 512
    assert (off.algo.clip_high, off.algo.dynamic_sampling) == (0.28, True)  # the rest is the preset's
