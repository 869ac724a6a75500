"""World-model rewards: 1 when the prediction is close to the real next state, else 0.

Embedding reward (the paper's): d = 1 - cos(E(prediction), E(next state)); r = 1 if d < tau_d.
`embedding_facts` (ours, for embedders that cannot see one wrong fact, MiniLM among them): the
same, and the prediction's checkable facts must equal the state's (`facts.py`).
An answer without a well-formed `<next_state>` gets reward 0 and distance 2 (the maximum).
The LLM-judge reward (an ablation of the paper) asks a chat model whether the two states match.

Long texts are never truncated. An embedder reads a bounded number of tokens (MiniLM 256 word
pieces) and silently drops the rest, which made a long tau2 state whose tail was wrong (order
status, payment) score distance 0 and reward 1. So when the embedder says how much it reads
(`embedders.TokenLimited`), a text over that limit is cut into chunks within it
(`chunking.split_text`: on lines, then sentences, list items, words), and a (prediction,
target) pair is compared chunk by chunk: d = the largest distance of aligned chunks (the i-th
against the i-th), so every part must be within tau_d; when the two have different numbers of
chunks (one omits or adds a tail) d = MAX_DISTANCE. A text within the limit is one chunk, and
its distance is exactly what a single embedding gives. Chunk boundaries follow the text, so a
paraphrase that moves a line across a boundary is compared part against shifted part and may
score higher than it would whole; a limit far above the states' length (Qwen3-Embedding's
32k context) avoids chunking altogether. `embedding_rewards_with_counts` and
`chunked_distances` also return counts worth logging (see `CHUNK_COUNTS`).
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

from jaxscaffold.worldmodel.chunking import split_text
from jaxscaffold.worldmodel.embedders import Embedder, TokenLimited
from jaxscaffold.worldmodel.facts import same_facts
from jaxscaffold.worldmodel.task import parse_prediction

MAX_DISTANCE = 2.0  # 1 - cos for opposite vectors: what an unparsable answer scores
# chunked_texts: distinct texts longer than the embedder's limit, embedded as several chunks;
# max_chunks: the most chunks of one text (1 when nothing was chunked, 0 for no text);
# truncated_texts: texts with a chunk still over the limit, which the embedder cut (should be 0);
# chunk_mismatches: pairs whose chunk counts differ, scored MAX_DISTANCE.
# fact_mismatches (the embedding_facts reward): predictions within tau_d whose facts were wrong.
CHUNK_COUNTS = ("chunked_texts", "max_chunks", "truncated_texts", "chunk_mismatches", "fact_mismatches")


def chunk_texts(embedder: Embedder, texts: Sequence[str]) -> tuple[list[list[str]], dict[str, int]]:
    """Each text's chunks (itself alone when within the embedder's limit, or when the embedder
    does not say its limit) and the counts `chunked_texts`, `max_chunks`, `truncated_texts`."""
    counts = {"chunked_texts": 0, "max_chunks": 1 if texts else 0, "truncated_texts": 0}
    if not isinstance(embedder, TokenLimited):
        return [[t] for t in texts], counts
    count, limit = embedder.count_tokens, embedder.max_tokens
    out = []
    for text in texts:
        if count(text) <= limit:
            out.append([text])
            continue
        chunks = split_text(text, count, limit)
        counts["chunked_texts"] += 1
        counts["max_chunks"] = max(counts["max_chunks"], len(chunks))
        counts["truncated_texts"] += any(count(c) > limit for c in chunks)
        out.append(chunks)
    return out, counts


def chunked_distances(embedder: Embedder, predictions: Sequence[str], targets: Sequence[str]
                      ) -> tuple[np.ndarray, dict[str, int]]:
    """(1 - cos between paired texts, chunk by chunk as the module docstring says; the counts of
    CHUNK_COUNTS). All chunks are embedded in one batch: duplicates cost nothing extra."""
    if len(predictions) != len(targets):
        raise ValueError(f"{len(predictions)} predictions for {len(targets)} targets")
    texts = list(dict.fromkeys(list(predictions) + list(targets)))
    chunks, counts = chunk_texts(embedder, texts)
    counts["chunk_mismatches"] = 0
    if not predictions:
        return np.zeros((0,), np.float64), counts
    unique = list(dict.fromkeys(c for cs in chunks for c in cs))
    row = {c: i for i, c in enumerate(unique)}
    emb = np.asarray(embedder(unique), np.float64)
    rows = {t: [row[c] for c in cs] for t, cs in zip(texts, chunks)}
    out = np.empty(len(predictions), np.float64)
    for i, (p, t) in enumerate(zip(predictions, targets)):
        a, b = rows[p], rows[t]
        if len(a) != len(b):
            out[i] = MAX_DISTANCE
            counts["chunk_mismatches"] += 1
        else:
            out[i] = np.max(1.0 - np.sum(emb[a] * emb[b], axis=1))
    return out, counts


def cosine_distances(embedder: Embedder, predictions: Sequence[str], targets: Sequence[str]) -> np.ndarray:
    """1 - cos between paired texts (long texts chunk by chunk: `chunked_distances`)."""
    return chunked_distances(embedder, predictions, targets)[0]


def embedding_rewards_with_counts(embedder: Embedder, answers: Sequence[str], targets: Sequence[str],
                                  tau_d: float) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(rewards, distances, chunk counts of CHUNK_COUNTS) of raw model answers against the real
    next states; the counts cover the parsed predictions and their targets."""
    parsed = [parse_prediction(a) for a in answers]
    ok = [i for i, p in enumerate(parsed) if p is not None]
    distances = np.full(len(answers), MAX_DISTANCE)
    distances[ok], counts = chunked_distances(embedder, [parsed[i] for i in ok], [targets[i] for i in ok])
    return (distances < tau_d).astype(np.float64), distances, counts


def embedding_facts_rewards_with_counts(embedder: Embedder, answers: Sequence[str], targets: Sequence[str],
                                        tau_d: float) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """`embedding_rewards_with_counts`, and a prediction whose facts (`facts.state_facts`:
    object ids, asserted states, outcomes; a JSON state's values) differ from the real next
    state's scores 0 whatever its distance; counted as `fact_mismatches`."""
    rewards, distances, counts = embedding_rewards_with_counts(embedder, answers, targets, tau_d)
    parsed = [parse_prediction(a) for a in answers]
    wrong = np.asarray([p is not None and not same_facts(p, t) for p, t in zip(parsed, targets)], bool)
    counts = {**counts, "fact_mismatches": int(np.sum(wrong & (rewards > 0)))}
    return np.where(wrong, 0.0, rewards), distances, counts


def embedding_rewards(embedder: Embedder, answers: Sequence[str], targets: Sequence[str], tau_d: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(rewards, distances) of raw model answers against the real next states."""
    rewards, distances, _ = embedding_rewards_with_counts(embedder, answers, targets, tau_d)
    return rewards, distances


JUDGE_PROMPT = (
    "You compare two descriptions of the state of a text environment. Reference:\n{target}\n\n"
    "Prediction:\n{prediction}\n\n{question}"
)
_QUESTIONS = {
    "binary": "Does the prediction describe the same state as the reference? Answer with one word: yes or no.",
    "continuous": "How well does the prediction match the reference, from 0 (not at all) to 10 (exactly)? "
                  "Answer with a single number.",
}


class JudgeReward:
    """Reward from a chat model (`chat(messages) -> reply text`): "binary" yes/no -> 1/0, or
    "continuous" 0..10 -> 0..1. Replies that say neither score 0 (and are counted)."""

    def __init__(self, chat: Callable[[list[dict]], str], mode: str = "binary"):
        if mode not in _QUESTIONS:
            raise ValueError(f"unknown judge mode {mode!r} ({', '.join(_QUESTIONS)})")
        self.chat, self.mode, self.unparsed = chat, mode, 0

    def score(self, prediction: str, target: str) -> float:
        reply = self.chat([{"role": "user", "content": JUDGE_PROMPT.format(
            target=target, prediction=prediction, question=_QUESTIONS[self.mode])}])
        reply = re.sub(r"<think>.*?</think>", "", reply, flags=re.DOTALL).strip().lower()
        if self.mode == "binary":
            word = re.match(r"[a-z]+", reply)
            if word and word.group() in ("yes", "no"):
                return float(word.group() == "yes")
        else:
            num = re.match(r"\d+(\.\d+)?", reply)
            if num and 0 <= float(num.group()) <= 10:
                return float(num.group()) / 10.0
        self.unparsed += 1
        return 0.0

    def __call__(self, answers: Sequence[str], targets: Sequence[str]) -> np.ndarray:
        out = []
        for a, t in zip(answers, targets):
            p = parse_prediction(a)
            out.append(0.0 if p is None else self.score(p, t))
        return np.asarray(out, np.float64)
