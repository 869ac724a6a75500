"""The scripted agents through the driver: the explorer's draws and the gold policy."""

import numpy as np

from jaxscaffold.envs.base import Observation, StepResult, Task
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.episodes.agents import ExplorerAgent, GoldAgent
from jaxscaffold.episodes.driver import run_episodes


class PathEnv:
    """Walks a 4-step gold path; any other admissible command stays put. Tag actions."""

    name = "sciworld"
    PATH = ["open door", "go north", "take key", "unlock box"]

    def reset(self, task):
        self.k, self.n = 0, 0
        return self._obs()

    def _obs(self):
        nxt = self.PATH[self.k] if self.k < len(self.PATH) else None
        return Observation(f"at {self.k}", {"admissible_commands": ["look", "wait"] + self.PATH,
                                            "next_walkthrough_action": nxt, "gold_actions": list(self.PATH)})

    def step(self, text):
        from jaxscaffold.envs.actions import action_of
        action, self.n = action_of(text), self.n + 1
        if self.k < len(self.PATH) and action == self.PATH[self.k]:
            self.k += 1
        won = self.k == len(self.PATH)
        return StepResult(self._obs(), float(won), won or self.n >= 20, {"won": won}, action=action)

    def close(self):
        pass


TASKS = [Task("sciworld", f"t{i}", "x") for i in range(3)]


def test_explorer_takes_the_expert_action_with_its_probability_and_is_seeded():
    def run(p, seed):
        return run_episodes(ExplorerAgent(gold_prob=p, seed=seed), LocalEnvs({"sciworld": PathEnv}), TASKS,
                            max_turns=6)
    always = run(1.0, 0)
    assert all(e.actions == PathEnv.PATH and e.won and e.steps == 4 for e in always)
    a, b = run(0.5, 3), run(0.5, 3)
    assert [e.actions for e in a] == [e.actions for e in b]
    assert all(len(e.observations) == e.steps + 1 for e in a)
    rng = np.random.default_rng(3)  # the draws, episode after episode in index order
    first = [PathEnv.PATH[0] if rng.random() < 0.5 else (["look", "wait"] + PathEnv.PATH)[rng.integers(6)]
             for _ in TASKS]
    assert [e.actions[0] for e in a] == first


def test_gold_agent_plays_the_gold_path():
    eps = run_episodes(GoldAgent(), LocalEnvs({"sciworld": PathEnv}), TASKS, max_turns=10)
    assert all(e.won and e.steps == 4 and e.failure is None and not e.truncated for e in eps)
