"""Exports a training checkpoint to a Hugging Face directory and checks it with transformers.

  python launch/export_hf.py --checkpoint runs/tiny --out /tmp/tiny-hf [--step N] [--dtype bfloat16]
      [--peft_out /tmp/tiny-lora]   (a LoRA run: also its adapters as a PEFT directory)
      [--no_verify] [--max_shard_gb 5]

The parameters alone are read (never the optimizer state), block by block, from a full or a
params-only checkpoint (checkpoint.params_only_every), and streamed into the safetensors
files: the host holds a few pieces of one tensor at a time. The transformers check holds the
whole model twice: pass --no_verify at scale.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a run's out_dir (or its checkpoints/ directory)")
    p.add_argument("--out", required=True, help="the HF directory to write")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--dtype", default=None, help="tensor dtype in the export (default: the parameters')")
    p.add_argument("--peft_out", default=None, help="a LoRA run: also write its adapters as a PEFT adapter directory")
    p.add_argument("--no_verify", action="store_true",
                   help="skip the transformers reload and logit comparison (it holds the model twice in memory)")
    p.add_argument("--max_shard_gb", type=float, default=5.0, help="safetensors shard size at most (GB, as transformers)")
    args = p.parse_args()
    if not args.max_shard_gb > 0:
        print(f"error: --max_shard_gb {args.max_shard_gb} must be > 0", file=sys.stderr)
        sys.exit(2)
    from jaxscaffold.models.hf_io import CheckpointError
    from jaxscaffold.train.checkpoint import CheckpointCorrupt, CheckpointNotFound
    from jaxscaffold.train.export import export_checkpoint
    try:
        report = export_checkpoint(args.checkpoint, args.out, step=args.step, dtype=args.dtype,
                                   peft_out=args.peft_out, verify=not args.no_verify,
                                   max_shard_bytes=int(args.max_shard_gb * 2**30))
    except (CheckpointNotFound, CheckpointCorrupt, CheckpointError, ValueError) as e:  # e.g. --peft_out without LoRA
        print(f"error: {e}", file=sys.stderr)
        # A damaged step's abandoned TensorStore reads are finalised as the process exits, each
        # printed as an "Exception ignored" traceback: the line above already says it all.
        sys.unraisablehook = lambda unraisable: None
        sys.exit(2)
    if report["max_abs_logit_diff"] is None:
        print(f"exported step {report['step']} to {report['out']} (not verified)")
    else:
        print(f"exported step {report['step']} to {report['out']}; transformers reload: "
              f"max |logit difference| = {report['max_abs_logit_diff']:.2e}")


if __name__ == "__main__":
    main()
