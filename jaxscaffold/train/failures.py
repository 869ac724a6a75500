"""Runs that cannot go on say so: `RunFailed` (one line; the launcher exits 1) and the
per-step guard that raises it when nothing trains.

A step is *bad* when an optimizer update of it was skipped (its loss or gradient norm was not
finite: the jitted step leaves the state unchanged, `rl.train_step`); a step is *empty* when
every episode of it failed (infrastructure: an env that cannot start, a prompt longer than the
context) or no row reached the loss. `rl.max_bad_steps` / `rl.max_empty_steps` consecutive
ones stop the run; the last checkpoint written before them is the last good one (the skipped
updates left the state as it was).
"""

from __future__ import annotations

import collections
import logging
from typing import Sequence

from jaxscaffold.train.multihost import allgather_json

log = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The run stopped because it cannot train (or cannot save): a one-line cause."""


def failure_kind(reason: str) -> str:
    """A failure reason's kind, for counting: its text before the first ':' ("context",
    "reset timeout", ...), at most 40 characters."""
    return reason.split(":", 1)[0].strip()[:40] or "unknown"


def summarise_failures(reasons: Sequence[str]) -> str:
    """"3 x context (e.g. context: first prompt of 900 tokens), 1 x reset timeout (e.g. ...)":
    the reasons counted by kind, the most frequent first, one example each."""
    counts = collections.Counter(failure_kind(r) for r in reasons)
    example = {}
    for r in reasons:
        example.setdefault(failure_kind(r), r)
    return ", ".join(f"{n} x {kind} (e.g. {example[kind][:160]})" for kind, n in counts.most_common())


class StepGuard:
    """Counts consecutive bad and empty steps and raises RunFailed at the limits."""

    def __init__(self, max_bad_steps: int, max_empty_steps: int):
        self.max_bad, self.max_empty = max_bad_steps, max_empty_steps
        self.bad = self.empty = 0
        self._reasons: list[str] = []  # the failures of the current run of empty steps

    def after_collect(self, step: int, episodes: Sequence, rows: int) -> None:
        """After a step's rollouts (this process's `episodes`; `rows` of them reach the loss):
        one warning line for the step's failed episodes, RunFailed after `max_empty_steps`
        empty steps in a row. Every process calls it (the counts are gathered)."""
        mine = {"episodes": len(episodes), "rows": rows,
                "failures": [str(e.failure) for e in episodes if e.failure is not None]}
        parts = allgather_json(mine)
        total = sum(p["episodes"] for p in parts)
        rows = sum(p["rows"] for p in parts)
        reasons = [r for p in parts for r in p["failures"]]
        failed = f"{len(reasons)} of {total} episodes failed: {summarise_failures(reasons)}" if reasons else ""
        if rows:
            self.empty, self._reasons = 0, []
            if reasons:
                log.warning("step %d: %s", step, failed)
            return
        self.empty += 1
        self._reasons += reasons
        log.warning("step %d trained nothing (%s; %d of rl.max_empty_steps=%d in a row)", step,
                    failed or "no row reached the loss", self.empty, self.max_empty)
        if self.empty >= self.max_empty:
            causes = summarise_failures(self._reasons) if self._reasons else \
                "no episode failed, but none gave a training row (e.g. DAPO kept no group)"
            raise RunFailed(f"nothing trained for {self.empty} steps in a row (rl.max_empty_steps={self.max_empty}), "
                            f"up to step {step}: {causes}")

    def after_update(self, step: int, train_metrics: dict) -> None:
        """After a step's updates: one warning line when one was skipped (non-finite loss or
        gradient norm), RunFailed after `max_bad_steps` such steps in a row."""
        skipped = train_metrics.get("train/skipped", 0.0)
        if not skipped:
            self.bad = 0
            return
        self.bad += 1
        log.warning("step %d: %.0f%% of its updates skipped (loss %s, grad norm %s: not finite); %d of "
                    "rl.max_bad_steps=%d in a row", step, 100 * skipped, train_metrics.get("train/loss"),
                    train_metrics.get("train/grad_norm"), self.bad, self.max_bad)
        if self.bad >= self.max_bad:
            raise RunFailed(f"{self.bad} steps in a row up to step {step} had a non-finite loss or gradient norm "
                            f"(rl.max_bad_steps={self.max_bad}); their updates were skipped, so the last "
                            "checkpoint holds the last good state")
