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

    def figure(self, name: str, value: float, unit: str, ratio: float | None = None, note: str = "") -> None:
        if self.json:
            obj = {"name": name, "value": round(value, 4), "unit": unit}
            if ratio is not None:
                obj["ratio"] = round(ratio, 4)
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
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
