"""World-model rewards: 1 when the prediction is close to the real next state, else 0.

Embedding reward (the paper's): d = 1 - cos(E(prediction), E(next state)); r = 1 if d < tau_d.
An answer without a well-formed `<next_state>` gets reward 0 and distance 2 (the maximum).
The LLM-judge reward (an ablation of the paper) asks a chat model whether the two states match.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

from jaxscaffold.worldmodel.embedders import Embedder
from jaxscaffold.worldmodel.task import parse_prediction

MAX_DISTANCE = 2.0  # 1 - cos for opposite vectors: what an unparsable answer scores


def cosine_distances(embedder: Embedder, predictions: Sequence[str], targets: Sequence[str]) -> np.ndarray:
    """1 - cos between paired texts (embedded in one batch: duplicates cost nothing extra)."""
    if len(predictions) != len(targets):
        raise ValueError(f"{len(predictions)} predictions for {len(targets)} targets")
    if not predictions:
        return np.zeros((0,), np.float64)
    texts = list(dict.fromkeys(list(predictions) + list(targets)))
    index = {t: i for i, t in enumerate(texts)}
    emb = np.asarray(embedder(texts), np.float64)
    a = emb[[index[p] for p in predictions]]
    b = emb[[index[t] for t in targets]]
    return 1.0 - np.sum(a * b, axis=1)


def embedding_rewards(embedder: Embedder, answers: Sequence[str], targets: Sequence[str], tau_d: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(rewards, distances) of raw model answers against the real next states."""
    parsed = [parse_prediction(a) for a in answers]
    ok = [i for i, p in enumerate(parsed) if p is not None]
    distances = np.full(len(answers), MAX_DISTANCE)
    distances[ok] = cosine_distances(embedder, [parsed[i] for i in ok], [targets[i] for i in ok])
    return (distances < tau_d).astype(np.float64), distances


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
