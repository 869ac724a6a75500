"""The output-probability probe (the FEE paper's internalisation test): the mean log-probability
a model gives the enriched outputs of 8 file-system operations, teacher-forced.

Each case (`cases.probe_cases`) is rendered with the model's chat template
(`Qwen3ChatRenderer`, tools in its tools block); the scored tokens are the text of the last
tool response, everything strictly between its `<tool_response>` and `</tool_response>` (the
output and the newline on either side, which BPE may merge with its first or last character).
Per operation the score is the mean over those tokens of log p(token | everything before it);
the probe's score is the mean of the 8 operations' scores (each operation weighs the same
whatever its length). A model whose training showed these outputs (OE) should score higher
than before; see `experiments/probe/probe.py`.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.rl.logprobs import masked_token_logprobs

ROW_MULTIPLE = 256  # rows are padded to a multiple of this (one compile for the 8 cases)


def probe_row(renderer: Qwen3ChatRenderer, case) -> tuple[list[int], int, int]:
    """(ids, start, end) of a case: its rendered ids and the span [start, end) scored."""
    if "<tool_response>" not in renderer.format.structure_tokens:
        raise ValueError(f"the probe needs <tool_response> as a chat token ({renderer.format.name} writes it as text)")
    ids = renderer.render(case.messages, tools=list(case.tools))
    opening, closing = (renderer.tokenizer.token_id(t) for t in ("<tool_response>", "</tool_response>"))
    start = max(i for i, t in enumerate(ids) if t == opening) + 1
    end = max(i for i, t in enumerate(ids) if t == closing)
    if not start < end:
        raise ValueError(f"probe case {case.operation}: its last tool response is empty")
    return ids, start, end


def batch_rows(rows: Sequence[tuple[list[int], int, int]], multiple: int = ROW_MULTIPLE) -> dict:
    """Right-padded tokens_BT, segment_ids_BT and loss_mask_BT (1 on each row's span)."""
    t = -(-max(len(ids) for ids, _, _ in rows) // multiple) * multiple
    tokens = np.zeros((len(rows), t), np.int32)
    seg = np.zeros((len(rows), t), np.int32)
    mask = np.zeros((len(rows), t), np.int32)
    for r, (ids, start, end) in enumerate(rows):
        tokens[r, :len(ids)], seg[r, :len(ids)], mask[r, start:end] = ids, 1, 1
    return {"tokens_BT": tokens, "segment_ids_BT": seg, "loss_mask_BT": mask}


@functools.partial(jax.jit, static_argnums=(1, 5))
def _logprobs(params, config, tokens_BT, segment_ids_BT, mask_BT, num_positions):
    return masked_token_logprobs(params, config, tokens_BT, mask_BT, num_positions, segment_ids_BT=segment_ids_BT)[0]


def span_logprobs(params, config, rows: Sequence[tuple[list[int], int, int]], *, rows_per_call: int = 1) -> list[float]:
    """The mean log-probability of each row's span under the model (teacher forcing)."""
    num_positions = max(end - start for _, start, end in rows)
    batch = batch_rows(rows)
    out = []
    # A few rows per call: each row's attention over its ~3k positions is what the memory holds.
    for i in range(0, len(rows), rows_per_call):
        part = {k: jnp.asarray(v[i:i + rows_per_call]) for k, v in batch.items()}
        logp = np.asarray(_logprobs(params, config, part["tokens_BT"], part["segment_ids_BT"], part["loss_mask_BT"],
                                    num_positions))
        mask = np.asarray(part["loss_mask_BT"])
        out += [float(np.sum(logp[r] * mask[r]) / np.sum(mask[r])) for r in range(len(logp))]
    return out


def probe_report(params, config, tokenizer, cases) -> dict:
    """{"operations": {op: {"mean_logprob", "tokens"}}, "mean_logprob": their mean} of `cases`."""
    renderer = Qwen3ChatRenderer(tokenizer)
    rows = [probe_row(renderer, c) for c in cases]
    scores = span_logprobs(params, config, rows)
    ops = {c.operation: {"mean_logprob": s, "tokens": end - start}
           for c, s, (_, start, end) in zip(cases, scores, rows)}
    return {"operations": ops, "mean_logprob": float(np.mean(scores))}
