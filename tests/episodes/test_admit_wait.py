"""`rollout.admit_wait_ms`: while rows decode, episodes whose envs have reset wait (boundedly)
for the other resets in flight, so their first prompts are prefilled in one call; a decoder with
nothing to do admits at once."""

import time

import pytest

from jaxscaffold.envs.base import Observation, StepResult, Task
from jaxscaffold.episodes.driver import run_episodes


class TimedResets:
    """The asynchronous env interface in this process: episode i's reset answers `reset_s[i]`
    after it is submitted, a step at once (and ends the episode)."""

    def __init__(self, reset_s):
        self.reset_s, self.due = reset_s, {}

    def open(self, tasks):
        pass

    def submit_reset(self, i):
        self.due[i] = (time.monotonic() + self.reset_s[i], Observation("go"))

    def submit_step(self, i, text):
        self.due[i] = (time.monotonic(), StepResult(Observation("end"), 1.0, True, {}))

    def poll(self, timeout_s):
        until = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            ready = {i: answer for i, (when, answer) in self.due.items() if when <= now}
            if ready or not self.due or (until is not None and now >= until):
                for i in ready:
                    del self.due[i]
                return ready
            time.sleep(max(0.0, min([when for when, _ in self.due.values()] + ([until] if until else [])) - now))

    def end(self, i):
        pass


class TimedTurns:
    """An agent of 4 places whose turn i takes `turn_s[i]` seconds of 10 ms decode chunks; it
    records the episodes of each prefill of first prompts."""

    capacity = 4

    def __init__(self, turn_s):
        self.turn_s, self.began, self.first_calls = turn_s, {}, []

    def prefill(self, episodes, first, seen):
        if first:
            self.first_calls.append(sorted(first))
        return {}, set()

    def decode(self, turns, chunk):
        time.sleep(0.01)
        now = time.monotonic()
        for i in turns:
            self.began.setdefault(i, now)
        return {i: "act" for i in turns if now - self.began[i] >= self.turn_s[i]}

    def release(self, episodes, i):
        pass

    def finish(self, episodes):
        pass


@pytest.mark.parametrize("wait_ms, calls", [(0.0, [[0], [1], [2], [3]]), (400.0, [[0], [1, 2], [3]])])
def test_first_prompts_wait_for_the_resets_in_flight_up_to_the_bound(wait_ms, calls):
    """Episode 0 resets at once and decodes for 2 s; 1 and 2 reset at 0.1 and 0.25 s, 3 at 1.2 s.
    Without a wait each first prompt is a call of its own. With 400 ms: 0 goes at once (nothing
    else decodes), 1 waits for 2 (the others in flight could take the free places), the bound
    (0.5 s) admits them together without 3, which comes alone."""
    agent = TimedTurns({0: 2.0, 1: 0.1, 2: 0.1, 3: 0.1})
    tasks = [Task("timed", f"t{i}", "x") for i in range(4)]
    started = time.monotonic()
    episodes = run_episodes(agent, TimedResets({0: 0.0, 1: 0.1, 2: 0.25, 3: 1.2}), tasks, max_turns=1,
                            admit_wait_ms=wait_ms)
    assert agent.first_calls == calls
    assert [e.actions for e in episodes] == [["act"]] * 4 and all(e.reward == 1.0 for e in episodes)
    assert time.monotonic() - started < 4.0


def test_a_negative_wait_is_refused():
    with pytest.raises(ValueError, match="admit_wait_ms"):
        run_episodes(TimedTurns({0: 0.0}), TimedResets({0: 0.0}), [Task("timed", "t0", "x")], max_turns=1,
                     admit_wait_ms=-1.0)
