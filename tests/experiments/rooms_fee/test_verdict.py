"""experiments/rooms_fee/verdict.py: the registered decision rules applied to the confirmatory
study's report, on synthetic runs whose verdicts are worked out by hand (exact sign-flip p over
the 2^12 sign patterns, Holm over four, the t-interval against the one-layout margin)."""

import json
import os

import pytest

from jaxscaffold.studies import report, runner, stats
from tests.experiments.rooms_fee import script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
L = 1 / 64  # one test layout
STEPS = list(range(2, 21, 2))
v = script("verdict")


def _run(final, zigzag=0.0):
    """A run's figures: an eval curve that ends at `final`, flat or zig-zagging by `zigzag`."""
    values = [final + (zigzag if i % 2 else 0.0) for i in range(len(STEPS) - 1)] + [final]
    history = [{"step": s, "eval/score": v} for s, v in zip(STEPS, values)]
    return stats.summarise_run(history, score="eval/score")


def _summary(tmp_path, monkeypatch, finals, zigzag=None):
    monkeypatch.setenv("ROOMS_CONFIRM_DIR", str(tmp_path))
    study = runner.load_study(os.path.join(ROOT, "experiments", "rooms_fee", "confirm.py"))
    zigzag = zigzag or {}
    runs = {arm: {seed: _run(finals[arm](i), zigzag.get(arm, 0.0)) for i, seed in enumerate(study.seeds)}
            for arm in study.arms}
    return report.json_safe(report.summarise_runs(study, runs, []))


def test_each_rule_gives_the_verdict_worked_out_by_hand(tmp_path, monkeypatch):
    # fee: 2 layouts above standard on every seed (p = 2 / 2^12), fee_random within +-1 layout of
    # fee, half each way (mean 0, p = 1) but zig-zagging (more variable on every seed), ag_only 2
    # layouts above fee on every seed.
    finals = {"standard": lambda i: 0.1, "fee": lambda i: 0.1 + 2 * L,
              "fee_random": lambda i: 0.1 + 2 * L + (L if i % 2 else -L), "ag_only": lambda i: 0.1 + 4 * L}
    summary = _summary(tmp_path, monkeypatch, finals, zigzag={"fee_random": 4 * L})
    got = {r["hypothesis"][:2]: r for r in v.verdicts(summary)}
    p_all_one_sign = 2 / 2 ** 12
    assert got["H1"]["p"] == pytest.approx(p_all_one_sign) and got["H1"]["n"] == 12
    assert got["H2"]["p"] == pytest.approx(1.0)
    # Holm over (p, 1, p, p): the three smallest times 4, 3, 2 (monotone), then 1.
    assert got["H1"]["p_holm"] == pytest.approx(4 * p_all_one_sign)
    assert got["H2"]["p_holm"] == pytest.approx(1.0)
    assert {k: r["verdict"] for k, r in got.items()} == {
        "H1": "supported", "H2": "not shown", "H3": "supported", "H4": "contradicted"}


@pytest.mark.parametrize("spread, expected", [(1, "supported"), (3, "not shown")])
def test_non_inferiority_needs_the_interval_above_minus_one_layout(tmp_path, monkeypatch, spread, expected):
    # fee - ag_only = +-spread layouts, half each way: mean 0, sd = spread * L * sqrt(12 / 11);
    # the t-interval's lower end is -t(0.975, 11) * sd / sqrt(12): -0.0104 (spread 1), -0.0311 (3).
    finals = {"standard": lambda i: 0.1, "fee": lambda i: 0.1, "fee_random": lambda i: 0.1,
              "ag_only": lambda i: 0.1 + (spread * L if i % 2 else -spread * L)}
    h4 = v.verdicts(_summary(tmp_path, monkeypatch, finals))[3]
    low = -2.2010 * spread * L * (12 / 11) ** 0.5 / 12 ** 0.5
    assert h4["low"] == pytest.approx(low, abs=1e-4)
    assert h4["verdict"] == expected and v.verdict({"mean": None, "p_holm": None, "low": None}, True) == "not shown"


def test_the_command_line_refuses_an_incomplete_design(tmp_path, monkeypatch, capsys):
    finals = {arm: (lambda i: 0.1) for arm in ("standard", "fee", "fee_random", "ag_only")}
    summary = _summary(tmp_path, monkeypatch, finals)
    path = tmp_path / "study.json"
    path.write_text(json.dumps(summary))
    assert v.main([str(path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.count("**not shown**") == 3 and "**supported**" in out  # H4: equal arms are non-inferior
    path.write_text(json.dumps({**summary, "missing": [{"arm": "fee", "seed": 111}]}))
    assert v.main([str(path)]) == 2
    assert "1 runs missing" in capsys.readouterr().err
    path.write_text(json.dumps({**summary, "contrasts": summary["contrasts"][1:]}))
    assert v.main([str(path)]) == 2
    assert "lacks the registered" in capsys.readouterr().err


def test_a_raw_p_below_five_percent_is_not_enough(tmp_path, monkeypatch):
    # fee - standard = +1 layout on 10 seeds, -1 on 2: p = P(10+ or 2- positive of 12 fair signs)
    # = 2 * (1 + 12 + 66) / 4096 = 0.0386; the other three contrasts have p = 1, so Holm's p is
    # 4 * 0.0386 = 0.154 and H1 is not shown.
    finals = {"standard": lambda i: 0.1, "fee": lambda i: 0.1 + (-L if i < 2 else L),
              "fee_random": lambda i: 0.1 + (-L if i < 2 else L), "ag_only": lambda i: 0.1 + (-L if i < 2 else L)}
    h1 = v.verdicts(_summary(tmp_path, monkeypatch, finals))[0]
    assert h1["p"] == pytest.approx(2 * 79 / 4096) and h1["p_holm"] == pytest.approx(4 * 2 * 79 / 4096)
    assert h1["mean"] > 0 and h1["verdict"] == "not shown"
