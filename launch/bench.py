"""Benchmarks: each prints its figures next to a reference measured in the same run.

  python launch/bench.py {sampler,train,envs,embed,tunix,train_flops,decode_bytes,lora,feedback,rollout} [--json] [--quick]
  python launch/bench.py rollout --json [--latency-ms MEDIAN --latency-p99-ms P99 --turns MIN-MAX --rows N
                                        --max-new-tokens T] [--env sciworld] [--staleness K --steps S]

`--json` prints one JSON object per figure: name, value, unit and, where there is a
reference, ratio (ours / reference).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchmarks import common  # noqa: E402

SUITES = {
    "sampler": "benchmarks.sampler",
    "train": "benchmarks.train",
    "envs": "benchmarks.envs",
    "embed": "benchmarks.embed",
    "tunix": "benchmarks.tunix_sampler",
    "train_flops": "benchmarks.train_flops",  # one train step's flops per remat policy vs 6NT + causal attention
    "decode_bytes": "benchmarks.decode_bytes",  # one accelerator decode step's bytes vs weights + filled KV
    "lora": "benchmarks.lora",
    "feedback": "benchmarks.feedback",  # ScienceWorld AG hints under a deviating gold policy
    "rollout": "benchmarks.rollout",  # one step's rollouts on a latency env: lock step vs async vs the bound
}
OWN_ARGUMENTS = {"rollout"}  # suites that parse further arguments of their own (`run(argv=...)`)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--json", action="store_true", help="one JSON object per figure")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller configs only")
    args, rest = parser.parse_known_args()
    if rest and args.suite not in OWN_ARGUMENTS:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    common.REPORT.json = args.json
    # The allocator changes XLA:CPU's timings (launch/dev.sh preloads tcmalloc where present).
    preload = os.environ.get("LD_PRELOAD", "")
    common.REPORT.say(f"# allocator: {'tcmalloc' if 'tcmalloc' in preload else 'glibc malloc'}")
    module = __import__(SUITES[args.suite], fromlist=["run"])
    if args.suite in OWN_ARGUMENTS:
        module.run(quick=args.quick, argv=rest)
    else:
        module.run(quick=args.quick)


if __name__ == "__main__":
    main()
