"""The confirmatory replication's report is its committed records': re-reporting
experiments/rooms_fee/confirm_results/runs gives docs/studies/fee_rooms_confirm.json to the
digit, and the report's verdict table is what verdict.py makes of it."""

import json
import os

from jaxscaffold.studies import report, runner
from tests.experiments.rooms_fee import script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RESULTS = os.path.join(ROOT, "experiments", "rooms_fee", "confirm_results")


def test_the_committed_report_is_the_records_report(monkeypatch):
    monkeypatch.setenv("ROOMS_CONFIRM_DIR", RESULTS)
    study = runner.load_study(os.path.join(ROOT, "experiments", "rooms_fee", "confirm.py"))
    summary, histories = report.summarise(study)
    assert summary["missing"] == [] and len(histories) == 48
    with open(os.path.join(ROOT, "docs", "studies", "fee_rooms_confirm.json")) as f:
        committed = json.load(f)
    assert json.loads(json.dumps(report.json_safe(summary))) == committed

    verdict = script("verdict")
    with open(os.path.join(ROOT, "docs", "studies", "fee_rooms_confirm.md")) as f:
        doc = f.read()
    assert verdict.markdown(verdict.verdicts(committed)) in doc
