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


def test_the_explorer_runs_tau2_with_gold_calls_and_valid_probe_calls():
    """tau2 has no admissible commands: with p = 1 the explorer is the gold path (and wins);
    with p = 0 every step is a probe call of another of the agent's tools, which tau2 accepts
    (never an invalid call) and answers with a real tool result."""
    import json

    import pytest
    tau2 = pytest.importorskip("jaxscaffold.envs.tau2")
    task = tau2.catalogue("retail/train")[0]
    envs = LocalEnvs({"tau2": tau2.Tau2Env})
    gold = run_episodes(ExplorerAgent(gold_prob=1.0, seed=0), envs, [task], max_turns=40)[0]
    assert gold.won and gold.failure is None
    probes = run_episodes(ExplorerAgent(gold_prob=0.0, seed=0), envs, [task], max_turns=5)[0]
    assert probes.failure is None and len(probes.actions) == 5
    gold_names = {json.loads(a.split("\n")[1])["name"] for a in gold.actions if "<tool_call>" in a}
    names = [json.loads(a.split("\n")[1])["name"] for a in probes.actions]
    assert len(set(names)) > 1 or not set(names) <= gold_names  # not only the gold path's calls
    assert all(o.startswith("<tool_response>") for o in probes.observations[1:]), probes.observations
