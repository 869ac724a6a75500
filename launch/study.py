"""Runs a study, arms x seeds, and reports it: `python launch/study.py --study NAME_OR_PATH`.

  python launch/study.py --study rooms_fee                # experiments/rooms_fee/study.py
  python launch/study.py --study rooms_fee --base-only    # build the base model only (before shards)
  python launch/study.py --study rooms_fee --shard 1/4    # this process's quarter of the runs
  python launch/study.py --study rooms_fee --report       # only summarise the finished runs
  python launch/study.py --study rooms_fee --from-json docs/studies/rooms_fee_run5.json \\
      --scores-at docs/studies/rooms_fee_run5_scores.json --markdown OUT.md   # re-report a committed study

A study that names its base model (`base` in the study file) builds it by its seeded commands
when it is missing, and says so (`--no-build-base`: a one-line error instead). Finished runs
are skipped, an interrupted one resumes from its checkpoint; `study.json` and `study.png` are
written after the runs: per arm the figures' means with 95% t-intervals, every declared
contrast's per-seed differences, mean, t-interval, exact sign-flip p and Holm-adjusted p.
`--from-json` recomputes those from a committed study.json (its per-run figures) with the study
file's contrasts, without running anything.
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
    """A study file: a path, or an experiment's name (experiments/NAME/study.py)."""
    for path in (value, os.path.join(ROOT, "experiments", value, "study.py")):
        if os.path.isfile(path):
            return path
    names = sorted(d for d in os.listdir(os.path.join(ROOT, "experiments"))
                   if os.path.isfile(os.path.join(ROOT, "experiments", d, "study.py")))
    raise runner.StudyError(f"no study {value!r} (not a file, not one of experiments/: {', '.join(names)})")


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise runner.StudyError(f"--shard {text!r}: expected i/n, e.g. 0/4") from None
    return i, n


def read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise runner.StudyError(f"{path}: {e}") from None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", required=True, help="a study file, or an experiment in experiments/ (NAME/study.py)")
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th run starting at i")
    p.add_argument("--report", action="store_true", help="summarise the finished runs only")
    p.add_argument("--json", action="store_true", help="print study.json's content")
    p.add_argument("--base-only", action="store_true", help="build the study's base model if missing, then stop")
    p.add_argument("--no-build-base", action="store_true", help="a missing base model is an error, not built")
    p.add_argument("--from-json", default="", help="re-report this committed study.json (nothing runs)")
    p.add_argument("--scores-at", default="", help="with --from-json: per-step eval scores the JSON lacks")
    p.add_argument("--markdown", default="", help="with --report or --from-json: also write the tables to this file")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("jaxscaffold.studies").setLevel(logging.INFO)
    try:
        study = runner.load_study(study_path(args.study))
        if args.from_json:
            summary = report.rereport(study, read_json(args.from_json),
                                      read_json(args.scores_at) if args.scores_at else None)
            tables = report.markdown(summary)
            if args.markdown:
                with open(args.markdown, "w") as f:
                    f.write(tables)
            print(json.dumps(report.json_safe(summary), allow_nan=False) if args.json else tables)
            return 0
        if not args.report:
            built = runner.ensure_base(study, ROOT, build=not args.no_build_base)
            if study.base and not built:
                print(f"study {study.name}: base model at {study.base['path']}")
            if args.base_only:
                return 0
            runner.run_study(study, os.path.join(ROOT, "configs"), shard=parse_shard(args.shard))
    except (runner.StudyError, *user_errors()) as e:  # bad input, as tpu_train.py reports it: one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = report.write_report(study)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown(summary))
    if args.json:
        print(json.dumps(report.json_safe(summary), allow_nan=False))
    else:
        for arm, a in summary["arms"].items():
            peak, final = a["peak"], a["final"]
            print(f"{arm:>16}: peak {peak['mean']:.3f} [{peak['low']:.3f}, {peak['high']:.3f}]  "
                  f"final {final['mean']:.3f} [{final['low']:.3f}, {final['high']:.3f}]  n={peak['n']}")
        for c in summary["contrasts"]:
            holm = "exploratory" if c["p_holm"] is None else f"Holm p {c['p_holm']:.3f}"
            print(f"  {c['name']}: {c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] n={c['n']}, "
                  f"sign-flip p {c['p']:.3f}, {holm}")
        print(f"study.json and study.png in {study.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
