"""Runs a study, arms x seeds, and reports it: `python launch/study.py --study NAME_OR_PATH`.

  python launch/study.py --study fee_rooms                # configs/studies/fee_rooms.py
  python launch/study.py --study fee_rooms --shard 1/4    # this process's quarter of the runs
  python launch/study.py --study fee_rooms --report       # only summarise the finished runs

Finished runs are skipped, an interrupted one resumes from its checkpoint; `study.json` and
`study.png` (per arm: mean and 95% bootstrap interval of the eval score's peak and final, the
first informative group's step, the informative share, the train reward's variability;
paired differences against the baseline over shared seeds) are written after the runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxscaffold.studies import report, runner  # noqa: E402
from tpu_train import user_errors  # noqa: E402  (launch/, this script's folder: one list of bad-input errors)


def study_path(value: str) -> str:
    for path in (value, os.path.join(ROOT, "configs", "studies", value),
                 os.path.join(ROOT, "configs", "studies", value + ".py")):
        if os.path.isfile(path):
            return path
    raise runner.StudyError(f"no study {value!r} (not a file, not in configs/studies/)")


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise runner.StudyError(f"--shard {text!r}: expected i/n, e.g. 0/4") from None
    return i, n


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", required=True, help="a study file, or a name in configs/studies/")
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th run starting at i")
    p.add_argument("--report", action="store_true", help="summarise the finished runs only")
    p.add_argument("--json", action="store_true", help="print study.json's content")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("jaxscaffold.studies").setLevel(logging.INFO)
    try:
        study = runner.load_study(study_path(args.study))
        if not args.report:
            runner.run_study(study, os.path.join(ROOT, "configs"), shard=parse_shard(args.shard))
    except (runner.StudyError, *user_errors()) as e:  # bad input, as tpu_train.py reports it: one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = report.write_report(study)
    if args.json:
        print(json.dumps(report.json_safe(summary), allow_nan=False))
    else:
        for arm, a in summary["arms"].items():
            peak, final = a["peak"], a["final"]
            print(f"{arm:>16}: peak {peak['mean']:.3f} [{peak['low']:.3f}, {peak['high']:.3f}]  "
                  f"final {final['mean']:.3f} [{final['low']:.3f}, {final['high']:.3f}]  n={peak['n']}")
        print(f"study.json and study.png in {study.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
