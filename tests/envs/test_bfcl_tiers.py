"""BFCL difficulty tiers: the criterion (gold turns with calls + gold calls), recomputed here from
bfcl-eval's own answer files, and the balance of the tiers over the validation set."""

from __future__ import annotations

import json
import pathlib
from collections import Counter

import pytest

bfcl_eval = pytest.importorskip("bfcl_eval")

from jaxscaffold.envs import bfcl as B  # noqa: E402


def _answers(category: str) -> dict[str, list[list[str]]]:
    """id -> per-turn gold calls, read straight from bfcl-eval's possible_answer file."""
    path = pathlib.Path(bfcl_eval.__file__).parent / "data" / "possible_answer" / f"BFCL_v3_multi_turn_{category}.json"
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["id"]: r["ground_truth"] for r in rows}


def test_tier_of_hand_made_gold_lists():
    # difficulty = turns that need calls + calls
    assert B.difficulty([["a()"], ["b()", "c()"], []]) == 5 and B.tier([["a()"], ["b()", "c()"], []]) == "easy"
    assert B.tier([["a()", "b()"], ["c()", "d()"], ["e()"]]) == "easy"  # 3 + 5 = 8, the easy bound
    assert B.tier([["a()", "b()"], ["c()", "d()"], ["e()", "f()"]]) == "medium"  # 3 + 6 = 9
    assert B.tier([["a()"] * 3, ["b()"] * 3, ["c()"] * 2]) == "hard"  # 3 + 8 = 11
    assert B.tier([[], []]) == "easy"


def test_validation_tiers_are_roughly_balanced_and_match_the_answer_files():
    tasks = B.catalogue("validation")
    answers = {c: _answers(c) for c in B.CATEGORIES}
    for t in tasks:
        gold = answers[t.category][t.task_id]
        d = sum(1 for turn in gold if turn) + sum(len(turn) for turn in gold)
        expected = "easy" if d <= 8 else "medium" if d <= 10 else "hard"
        assert t.tags == (f"tier_{expected}",) and t.spec["tier"] == expected, t.task_id
    sizes = Counter(t.spec["tier"] for t in tasks)
    per_category = {c: Counter(t.spec["tier"] for t in tasks if t.category == c) for c in B.CATEGORIES}
    print(f"BFCL validation tiers: {dict(sizes)}; per category: {per_category}")
    assert sum(sizes.values()) == 400 and set(sizes) == set(B.TIERS)
    assert all(120 <= n <= 150 for n in sizes.values()), sizes  # each within 30-37.5% of the set
    assert all(30 <= n <= 37 for c in per_category.values() for n in c.values()), per_category
    assert sizes == {"easy": 136, "medium": 132, "hard": 132}  # the sizes the criterion's comment states


def test_eval_py_prints_the_per_tier_success(tmp_path):
    import os
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    out = tmp_path / "episodes.jsonl"
    run = subprocess.run([sys.executable, str(root / "launch" / "eval.py"), "--config", "fee_bfcl.py",
                          "--config.eval.tasks=12", "--policy", "gold", "--workers", "1", "--out", str(out), "--json"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr[-2000:]
    records = [json.loads(line) for line in open(out)]
    tiers = {t.task_id: t.tags for t in B.catalogue("validation")}
    assert all(tuple(r["tags"]) == tiers[r["task_id"]] for r in records)
    metrics = json.loads(run.stdout.strip().splitlines()[-1])["metrics"]
    for tier in B.TIERS:
        key = f"eval/success_bfcl/tier_{tier}"
        won = [r["won"] for r in records if f"tier_{tier}" in r["tags"]]
        assert won and metrics[key] == pytest.approx(sum(won) / len(won))
        assert f"  {key} {metrics[key]:.3f}" in run.stdout.splitlines()
