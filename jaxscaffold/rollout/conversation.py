"""Multi-turn, token-in-token-out episodes on top of the sampler's slots.

A `Conversation` is the exact token sequence the model saw and produced, with an assistant
mask (1 = sampled by the policy, trained on; 0 = prompt / environment) and the sampled
tokens' logprobs aligned with it. The history is never re-tokenised: environment text is
tokenised once when it arrives, generated ids are kept as they were sampled.

`MultiTurn` keeps one conversation per slot and the sampler state: `extend` prefills only
new (environment) tokens, `generate` continues the chosen slots (`decode`: by chunks of a few
tokens, each slot's turn resumed until it ends, so rows can join between chunks), `reprefill`
recomputes slots' caches under new weights, `release` hands back a finished conversation and
frees its slot for the next episode.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from jaxscaffold.rollout.engine import Generation, Sampler, SamplerState


@dataclasses.dataclass
class Conversation:
    """Token ids with an aligned assistant mask and policy logprobs (and, once recorded, the
    policy version that sampled each token)."""

    ids: list[int] = dataclasses.field(default_factory=list)
    assistant_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish_reasons: list[str] = dataclasses.field(default_factory=list)
    # Per token, the policy version (updates applied) that sampled it, -1 on context tokens;
    # a prefix of the ids: `record_version` covers the tokens added since its last call.
    versions: list[int] = dataclasses.field(default_factory=list)

    def record_version(self, version: int) -> None:
        """Marks the tokens added since the last call as sampled by policy `version` (context
        tokens -1). Call it whenever the weights change (and at the end of an episode), so a
        conversation continued under newer weights keeps each token's own version."""
        self.versions.extend(version if m else -1 for m in self.assistant_mask[len(self.versions):])

    def sampled_versions(self) -> list[int]:
        """The recorded versions of the sampled tokens (empty: none recorded)."""
        return [v for v, m in zip(self.versions, self.assistant_mask) if m]

    def add_context(self, ids: Sequence[int]) -> None:
        self.ids.extend(int(i) for i in ids)
        self.assistant_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def add_generation(self, gen: Generation, *, ends_turn: bool = True) -> None:
        """Appends sampled tokens; `ends_turn=False`: a piece of a turn still being decoded
        (its finish reason is recorded with the turn's last piece)."""
        self.ids.extend(int(i) for i in gen.tokens)
        self.assistant_mask.extend([1] * len(gen.tokens))
        self.logprobs.extend(float(x) for x in gen.logprobs)
        if ends_turn:
            self.finish_reasons.append(gen.finish_reason)

    def __len__(self) -> int:
        return len(self.ids)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"ids": np.asarray(self.ids, np.int32),
               "assistant_mask": np.asarray(self.assistant_mask, np.int32),
               "logprobs": np.asarray(self.logprobs, np.float32)}
        if self.versions:  # recorded: aligned with the ids (-1 past the last record)
            out["versions"] = np.asarray(self.versions + [-1] * (len(self.ids) - len(self.versions)), np.int32)
        return out


@dataclasses.dataclass
class _OpenTurn:
    """A turn `MultiTurn.decode` has started and not ended: its seed, budget left, pieces."""

    seed: int
    remaining: int
    pieces: list[Generation] = dataclasses.field(default_factory=list)


class MultiTurn:
    """Conversations living in sampler slots (host-side bookkeeping, device-side cache)."""

    def __init__(self, sampler: Sampler, state: SamplerState | None = None):
        self.sampler = sampler
        self.state = sampler.init_state() if state is None else state
        self.conversations: dict[int, Conversation] = {}
        self._open: dict[int, _OpenTurn] = {}  # slot -> its turn being decoded in chunks (`decode`)

    def free_slots(self) -> list[int]:
        return [s for s in range(self.sampler.batch_size) if s not in self.conversations]

    def room(self, slot: int) -> int:
        """Tokens that still fit in a slot (one cache slot stays spare)."""
        return self.sampler.max_len - 1 - len(self.conversations.get(slot, ()))

    def _lengths(self) -> np.ndarray:
        # Every token of a conversation is in the cache, so its length is the cache length.
        return np.asarray([len(self.conversations.get(s, ())) for s in range(self.sampler.batch_size)], np.int32)

    def extend(self, params, tokens: Mapping[int, Sequence[int]]) -> None:
        """Appends context tokens (a prompt, an observation) to slots, starting new
        conversations in empty slots."""
        self.state = self.sampler.extend(params, self.state, tokens, lengths=self._lengths())
        for slot, ids in tokens.items():
            self.conversations.setdefault(slot, Conversation()).add_context(ids)

    def generate(self, params, slots: Sequence[int], *, max_new_tokens: int,
                 seeds: Sequence[int]) -> dict[int, Generation]:
        """Samples the next assistant turn in each slot; the other slots wait."""
        missing = [s for s in slots if s not in self.conversations]
        if missing:
            raise ValueError(f"slots {missing} have no conversation: extend them with a prompt first")
        self.state, out = self.sampler.generate(params, self.state, slots, max_new_tokens=max_new_tokens,
                                                seeds=seeds, lengths=self._lengths())
        for slot, gen in out.items():
            self.conversations[slot].add_generation(gen)
        return out

    def decode(self, params, turns: Mapping[int, tuple[int, int]], *, chunk: int) -> dict[int, Generation]:
        """Decodes up to `chunk` more tokens of each slot's current turn and returns the turns
        that ended (a stop token, or their budget); the others stay open for the next call.
        `turns`: slot -> (the turn's token budget, its sampling seed), read when a slot's turn
        opens. Sampling keys depend on positions only, so a turn decoded in chunks has the
        tokens of one `generate` call (up to numerics that the batch's window can change)."""
        for slot, (budget, seed) in turns.items():
            if slot not in self.conversations:
                raise ValueError(f"slot {slot} has no conversation: extend it with a prompt first")
            if slot not in self._open:  # a new turn: its budget as `generate` caps it
                self._open[slot] = _OpenTurn(seed, max(0, min(budget, self.room(slot))))
        slots = list(turns)
        open_turns = [self._open[s] for s in slots]
        self.state, out = self.sampler.generate(
            params, self.state, slots, max_new_tokens=[min(chunk, t.remaining) for t in open_turns],
            seeds=[t.seed for t in open_turns], lengths=self._lengths())
        ended = {}
        for slot, turn in zip(slots, open_turns):
            piece = out[slot]
            turn.pieces.append(piece)
            turn.remaining -= len(piece.tokens)
            done = piece.finish_reason == "stop" or turn.remaining <= 0
            self.conversations[slot].add_generation(piece, ends_turn=done)
            if done:
                del self._open[slot]
                ended[slot] = Generation(
                    tokens=np.concatenate([p.tokens for p in turn.pieces]),
                    logprobs=np.concatenate([p.logprobs for p in turn.pieces]),
                    sampling_logprobs=np.concatenate([p.sampling_logprobs for p in turn.pieces]),
                    finish_reason=piece.finish_reason)
        return ended

    def reprefill(self, params, slots: Sequence[int]) -> None:
        """Recomputes the cache of `slots` from their conversations' tokens under `params` (new
        weights mid-episode, computed exactly; an open turn continues from the new cache)."""
        slots = [s for s in slots if s in self.conversations]
        if not slots:
            return
        self.state = self.sampler.release(self.state, slots)
        lengths = self._lengths()
        lengths[slots] = 0
        self.state = self.sampler.extend(params, self.state, {s: self.conversations[s].ids for s in slots},
                                         lengths=lengths)

    def release(self, slots: Sequence[int]) -> dict[int, Conversation]:
        """Ends the conversations in `slots`, frees their cache slots and returns them."""
        done = {s: self.conversations.pop(s) for s in slots}
        for s in slots:
            self._open.pop(s, None)
        self.state = self.sampler.release(self.state, slots)
        return done
