"""Moves an HF model directory to a larger word-level vocabulary:
`python launch/extend_vocabulary.py IN_DIR OUT_DIR --from rooms --to rooms_wm`.

The rooms RWML study starts every arm from launch/rooms_base.py's base (trained on the
`rooms` words); its world-model stages write words that vocabulary lacks (`<next_state>`),
so the base is moved to `rooms_wm` first (`jaxscaffold.models.vocab_transfer`: learned rows
kept, new words freshly initialised). A run loads OUT_DIR with `model.vocabulary=rooms_wm`.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxscaffold.models import hf_io, vocab_transfer  # noqa: E402
from jaxscaffold.train.vocabularies import VOCABULARIES, word_tokenizer  # noqa: E402


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("in_dir")
    p.add_argument("out_dir")
    p.add_argument("--from", dest="source", default="rooms", help=f"one of {', '.join(VOCABULARIES)}")
    p.add_argument("--to", dest="target", default="rooms_wm", help=f"one of {', '.join(VOCABULARIES)}")
    p.add_argument("--seed", type=int, default=0, help="the new rows' init")
    args = p.parse_args(argv)
    try:
        old, new = word_tokenizer(args.source), word_tokenizer(args.target)
        config, params = hf_io.load_pretrained(args.in_dir)
        config, params = vocab_transfer.transfer(config, params, old, new, seed=args.seed)
    except (KeyError, ValueError, OSError, hf_io.CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    hf_io.save_pretrained(args.out_dir, config, params)
    print(f"wrote {args.out_dir} ({args.target}: {new.vocab_size} ids, {config.vocab_size} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
