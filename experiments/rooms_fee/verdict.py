"""The confirmatory replication's verdicts: `python experiments/rooms_fee/verdict.py STUDY_JSON [--markdown]`.

Applies the decision rules registered in experiments/rooms_fee/expected.md ("Confirmatory
replication") to the study.json `launch/study.py --study experiments/rooms_fee/confirm.py
--report` writes, and prints one line per hypothesis (H1-H4, the Holm family):
  H1-H3 (a - b > 0): supported when Holm p < 0.05 and the mean difference is positive;
                     contradicted when Holm p < 0.05 and it is negative; otherwise not shown.
  H4 (fee >= ag_only, non-inferior by one layout): supported when the 95% t-interval's lower
                     end is above -1/64 and it is not contradicted; contradicted when Holm p < 0.05
                     and fee is below; otherwise not shown.
The rules are written here as registered, before the runs were analysed; nothing is tuned to them.
"""

from __future__ import annotations

import argparse
import json
import sys

ALPHA = 0.05
NON_INFERIORITY_MARGIN = 1 / 64  # one of the 64 test layouts
# The Holm family's contrasts, (a, b, metric) as confirm.py declares them (with each hypothesis's
# text), and whether the registered rule is non-inferiority (H4) rather than superiority.
NON_INFERIORITY = {("fee", "standard", "final"): False, ("fee", "fee_random", "final"): False,
                   ("fee_random", "fee", "eval_variability"): False, ("fee", "ag_only", "final"): True}


def verdict(row: dict, non_inferiority: bool) -> str:
    """'supported', 'contradicted' or 'not shown' for one contrast row of study.json."""
    mean, p_holm, low = row["mean"], row["p_holm"], row["low"]
    if mean is None or p_holm is None:
        return "not shown"
    significant = p_holm < ALPHA
    if significant and mean < 0:
        return "contradicted"
    if non_inferiority:
        return "supported" if low is not None and low > -NON_INFERIORITY_MARGIN else "not shown"
    return "supported" if significant and mean > 0 else "not shown"


def verdicts(summary: dict) -> list[dict]:
    """One dict per registered hypothesis: its text (the study file's), the contrast's numbers and the verdict."""
    rows = {(c["a"], c["b"], c["metric"]): c for c in summary["contrasts"] if not c["exploratory"]}
    missing = [key for key in NON_INFERIORITY if key not in rows]
    if missing:
        raise ValueError(f"study.json lacks the registered confirmatory contrasts {missing}")
    out = []
    for key, non_inferiority in NON_INFERIORITY.items():
        row = rows[key]
        out.append({"hypothesis": row["hypothesis"], "n": row["n"], "mean": row["mean"], "low": row["low"], "high": row["high"],
                    "p": row["p"], "p_holm": row["p_holm"], "verdict": verdict(row, non_inferiority)})
    return out


def markdown(results: list[dict]) -> str:
    def num(v):
        return "n/a" if v is None else f"{v:+.4f}"

    lines = ["| hypothesis | n | mean difference [95% t-interval] | sign-flip p | Holm p | verdict |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['hypothesis']} | {r['n']} | {num(r['mean'])} [{num(r['low'])}, {num(r['high'])}] | "
                     f"{r['p']:.4f} | {r['p_holm']:.4f} | **{r['verdict']}** |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study_json")
    p.add_argument("--markdown", action="store_true", help="a Markdown table instead of one line each")
    args = p.parse_args(argv)
    try:
        with open(args.study_json) as f:
            summary = json.load(f)
        results = verdicts(summary)
    except (OSError, ValueError, KeyError) as e:
        print(f"verdict.py: {args.study_json}: {e}", file=sys.stderr)
        return 2
    if summary.get("missing"):
        print(f"verdict.py: {len(summary['missing'])} runs missing; the registration tests the whole design",
              file=sys.stderr)
        return 2
    if args.markdown:
        print(markdown(results), end="")
    else:
        for r in results:
            print(f"{r['verdict']:>12}  {r['hypothesis']}: mean {r['mean']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}], "
                  f"p {r['p']:.4f}, Holm p {r['p_holm']:.4f} (n={r['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
