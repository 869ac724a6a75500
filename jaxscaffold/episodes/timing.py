"""Where a batch of episodes spends its time: `run_episodes(..., timings=Timings())` fills one.

- `decode_s`, `prefill_s`: wall seconds of the agent's decode and prefill calls (a call serves
  every row in it at once, so it is counted once, not once per row);
- `env_s`: seconds episodes waited on their envs (resets and steps), summed over episodes (in
  lock step an episode waits for its batch's whole call);
- `wall_s`: the driver's wall clock from its first reset to its last episode;
- `busy_s`: seconds the accelerator was busy (decode + prefill calls): `idle_share` is the
  rest of the wall clock, the share a rollout leaves the accelerator waiting on envs and host.

A `Timings` adds up over several driver calls (`+=`), e.g. a step's generation batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time


@dataclasses.dataclass
class Timings:
    """Seconds a rollout spent decoding, prefilling, in its envs and in all (see the module)."""

    decode_s: float = 0.0
    prefill_s: float = 0.0
    env_s: float = 0.0
    wall_s: float = 0.0
    busy_s: float = 0.0

    @property
    def idle_share(self) -> float:
        """The share of the wall clock the accelerator was not busy (0 when nothing ran)."""
        return max(0.0, 1.0 - self.busy_s / self.wall_s) if self.wall_s > 0 else 0.0

    @contextlib.contextmanager
    def accelerator(self, kind: str):
        """Times a block of accelerator work (`kind`: "decode" or "prefill"); the block must
        wait for its results (no asynchronous dispatch left running) for the figure to hold."""
        if kind not in ("decode", "prefill"):
            raise ValueError(f"unknown accelerator work {kind!r}: decode or prefill")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            setattr(self, f"{kind}_s", getattr(self, f"{kind}_s") + dt)
            self.busy_s += dt

    def __iadd__(self, other: "Timings") -> "Timings":
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def stats(self, prefix: str = "time") -> dict[str, float]:
        """The step statistics: `time/decode_s`, `time/prefill_s`, `time/env_s`,
        `time/rollout_idle_share`."""
        return {f"{prefix}/decode_s": self.decode_s, f"{prefix}/prefill_s": self.prefill_s,
                f"{prefix}/env_s": self.env_s, f"{prefix}/rollout_idle_share": self.idle_share}
