"""Episodes -> the padded arrays of one train step (trajectory representation).

One row per episode: its whole token sequence, the assistant mask (model tokens trained on,
environment tokens masked out) and the sampled logprobs, right-padded to a length bucket so a
run compiles few train-step programs. Rows are padded up to a multiple of `row_multiple`
(micro-batches x data-parallel devices) with empty rows, which weigh nothing in the loss.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxscaffold.buckets import pow2_bucket
from jaxscaffold.rollout.conversation import Conversation


def build_batch(conversations: Sequence[Conversation], adv: Sequence[float], *, row_multiple: int = 1,
                min_len: int = 64) -> dict[str, np.ndarray]:
    lengths = [len(c) for c in conversations]
    t = pow2_bucket(max(lengths, default=1), min_len)
    rows = max(1, len(conversations))
    rows += (-rows) % row_multiple
    out = {
        "tokens_BT": np.zeros((rows, t), np.int32),
        "segment_ids_BT": np.zeros((rows, t), np.int32),
        "loss_mask_BT": np.zeros((rows, t), np.int32),
        "old_logp_BT": np.zeros((rows, t), np.float32),
        "adv_B": np.zeros((rows,), np.float32),
    }
    for r, (conv, a) in enumerate(zip(conversations, adv)):
        arr, n = conv.arrays(), len(conv)
        out["tokens_BT"][r, :n] = arr["ids"]
        out["segment_ids_BT"][r, :n] = 1
        out["loss_mask_BT"][r, :n] = arr["assistant_mask"]
        out["old_logp_BT"][r, :n] = arr["logprobs"]
        out["adv_B"][r] = a
    return out
