"""The output-probability probe (the FEE paper's internalisation test): the mean log-probability
a model gives the OE-enriched outputs of 8 BFCL file-system operations (cd, mkdir, touch, rm,
rmdir, mv, cp, echo), teacher-forced with the model's chat template, per operation and their
mean (`experiments.probe.scoring`; the cases: `experiments.probe.cases`).

  python experiments/probe/probe.py --checkpoint runs/fee_bfcl [--step N] --json   (a training run's model)
  python experiments/probe/probe.py --model /path/to/hf_dir --json                  (an HF directory)
  python experiments/probe/probe.py --config fee_bfcl.py --json                     (a config's untrained model)

Run it on the checkpoints of a FEE run and of a standard run: the paper reads a rising score
as the feedback being written into the weights. `--json` prints one JSON object: the model's
source, "operations" ({op: {"mean_logprob", "tokens"}}) and "mean_logprob". Bad input (no
checkpoint, an unreadable model) is one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def fail(message: str) -> None:
    """Bad input: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.unraisablehook = lambda unraisable: None  # a damaged step's abandoned reads, at exit
    sys.exit(2)


def from_checkpoint(path: str, step: int | None):
    """(params, model config, tokenizer, step) of a run's checkpoint (its out_dir, checkpoints/
    or params/): the parameters alone, LoRA's adapters merged, f32 compute."""
    from jaxscaffold.train.export import read_policy
    from jaxscaffold.train.job import run_tokenizer
    cfg, config, params, step = read_policy(path, step)
    return params, config, run_tokenizer(cfg.model), step


def from_config(cfg):
    """(params, model config, tokenizer) of a config's model before training (its HF
    checkpoint, or its preset's seeded init)."""
    from jaxscaffold.train.job import build_model, run_tokenizer
    config, params = build_model(cfg, None)
    return params, config, run_tokenizer(cfg.model)


def from_hf(path: str, compute_dtype: str):
    """(params, model config, tokenizer) of an HF directory (its tokenizer, else the offline one)."""
    from jaxscaffold.models import hf_io
    from jaxscaffold.models.tokenizer import load_tokenizer
    config, params = hf_io.load_pretrained(path, dtype="float32", compute_dtype=compute_dtype)
    has_tokenizer = os.path.exists(os.path.join(path, "tokenizer_config.json"))
    return params, config, load_tokenizer(path if has_tokenizer else None)


def main(argv: list[str] | None = None) -> None:
    from jaxscaffold import config as config_lib
    argv = sys.argv[1:] if argv is None else argv
    try:
        base, rest, show_help = config_lib.from_command_line(argv, os.path.join(ROOT, "configs"))
        if base is not None:
            from jaxscaffold.train.config_checks import check
            check(base)
    except config_lib.ConfigError as e:
        fail(str(e))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="", help="a training run's out_dir (or its checkpoints/ or params/)")
    p.add_argument("--step", type=int, default=None, help="its checkpoint step (default: the latest)")
    p.add_argument("--model", default="", help="an HF model directory")
    p.add_argument("--config", help="a config (name in configs/ or path): its model before training")
    p.add_argument("--dtype", default="float32", help="--model: the compute dtype (default float32)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(rest + (["--help"] if show_help else []))
    if sum(map(bool, (args.checkpoint, args.model, base is not None))) != 1:
        fail("give one of --checkpoint DIR, --model HF_DIR or --config NAME_OR_PATH")
    from jaxscaffold.envs.base import EnvError
    from experiments.probe.cases import PROBE_ENTRY, probe_cases
    from jaxscaffold.models.hf_io import CheckpointError
    from jaxscaffold.train.checkpoint import CheckpointCorrupt, CheckpointNotFound
    from experiments.probe.scoring import probe_report
    try:
        cases = probe_cases()
        if args.checkpoint:
            params, config, tokenizer, step = from_checkpoint(args.checkpoint, args.step)
            source = {"checkpoint": args.checkpoint, "step": step}
        elif args.model:
            params, config, tokenizer = from_hf(args.model, args.dtype)
            source = {"model": args.model}
        else:
            params, config, tokenizer = from_config(base)
            source = {"config": config_lib.config_name(argv)}
        report = probe_report(params, config, tokenizer, cases)
    except (CheckpointNotFound, CheckpointCorrupt, CheckpointError, config_lib.ConfigError, EnvError, ValueError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    report = {**source, "entry": PROBE_ENTRY, "compute_dtype": str(config.compute_dtype), **report}
    if args.json:
        print(json.dumps(report))
        return
    for op, r in report["operations"].items():
        print(f"{op:6s} {r['mean_logprob']:9.4f}  ({r['tokens']} tokens)")
    print(f"mean   {report['mean_logprob']:9.4f}")


if __name__ == "__main__":
    main()
