"""Moves a model from one word-level vocabulary to a larger one (e.g. `rooms` -> `rooms_wm`).

Why: a testbed's base is trained on its own words; a later stage that writes new words (RWML's
`<next_state>` answers) needs their ids. Every piece both tokenizers know keeps its learned
row (embedding, and the LM head when untied), wherever its new id is; the new pieces' rows
are a fresh init, so on every old text the moved model gives each old piece the logit it gave
before.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.tokenizer import Tokenizer
from jaxscaffold.models.word_tokenizer import padded_vocab_size


def id_map(old: Tokenizer, new: Tokenizer) -> dict[int, int]:
    """new id -> old id for every piece (and control token) both tokenizers hold."""
    old_ids = {old.decode([i]): i for i in range(old.vocab_size)}
    out = {}
    for i in range(new.vocab_size):
        j = old_ids.get(new.decode([i]))
        if j is not None:
            out[i] = j
    return out


def transfer(config: Qwen3Config, params: dict, old: Tokenizer, new: Tokenizer, seed: int = 0
             ) -> tuple[Qwen3Config, dict]:
    """(config, params) on `new`'s vocabulary: old rows moved to their pieces' new ids, the
    rest freshly initialised (seeded). Every piece of `old` must be in `new`."""
    mapping = id_map(old, new)
    if len(mapping) != old.vocab_size:
        raise ValueError(f"{old.vocab_size - len(mapping)} pieces of the old vocabulary are not in the new one")
    out_config = dataclasses.replace(config, vocab_size=padded_vocab_size(new))
    fresh = jax.device_get(qwen3.init_params(out_config, jax.random.key(seed)))
    out = {k: v for k, v in jax.device_get(params).items() if k not in ("embed", "lm_head")}
    new_ids, old_ids = (np.asarray(x) for x in zip(*sorted(mapping.items())))
    embed = np.array(fresh["embed"])
    embed[new_ids] = np.asarray(params["embed"])[old_ids]
    out["embed"] = embed
    if out_config.has_lm_head:
        head = np.array(fresh["lm_head"])
        head[:, new_ids] = np.asarray(params["lm_head"])[:, old_ids]
        out["lm_head"] = head
    return out_config, out
