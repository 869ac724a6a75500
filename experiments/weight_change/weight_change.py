"""How much training moved a model's weights, layer by layer (the RWML paper's RWML-vs-SFT evidence).

    python experiments/weight_change/weight_change.py BASE_HF_DIR TRAINED_HF_DIR [--json]

Prints ||W_trained - W_base||_F / ||W_base||_F for each layer's attention (q, k, v, o) and MLP
(gate, up, down) matrices, their mean per module type, and the overall change; `--json` prints
one JSON object instead. Checkpoints are read one tensor block at a time (two 8B checkpoints
need no more than a few hundred MB of RAM). Errors are one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="the HF checkpoint directory before training")
    p.add_argument("trained", help="the HF checkpoint directory after training")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    from experiments.weight_change.relative_change import WeightChangeError, format_table, weight_change
    try:
        report = weight_change(args.base, args.trained)
    except WeightChangeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(report) if args.json else format_table(report))


if __name__ == "__main__":
    main()
