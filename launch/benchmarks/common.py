"""Shared helpers of the benchmark scripts: timing and reporting."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Callable


@dataclasses.dataclass
class Report:
    json: bool = False

    def figure(self, name: str, value: float, unit: str, ratio: float | None = None, note: str = "",
               fields: dict | None = None) -> None:
        """One figure; `fields` (JSON only): more named values of it."""
        if self.json:
            obj = {"name": name, "value": round(value, 4), "unit": unit}
            if ratio is not None:
                obj["ratio"] = round(ratio, 4)
            obj.update(fields or {})
            print(json.dumps(obj), flush=True)
        else:
            extra = f"   ratio {ratio:.2f}x" if ratio is not None else ""
            print(f"{name:<58} {value:>12.2f} {unit:<10}{extra} {note}", flush=True)

    def say(self, text: str) -> None:
        if not self.json:
            print(text, flush=True)


REPORT = Report()


def median_time(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Median wall time of fn() over reps runs, after warm-up runs (compilation)."""
    def wall():
        fn()  # whatever it returns, its wall time counts

    return interleaved_medians({"fn": wall}, reps, warmup)["fn"]


def interleaved_medians(fns: dict[str, Callable[[], float | None]], reps: int, warmup: int = 1) -> dict[str, float]:
    """Median time of each fn over `reps` rounds that each run every fn once, in turn: on a
    shared, noisy machine a slow spell then costs every side alike instead of whichever ran
    during it. A fn that returns a float reports its own time (a part of what it ran, e.g.
    decoding after a prefill); otherwise its wall time counts."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            own = fn()
            times[name].append(own if isinstance(own, float) else time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}
