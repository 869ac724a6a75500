"""The world-model task: a prompt with the history and the action; the answer
`<think>...</think><next_state>...</next_state>`; parsing that answer (untrusted text)."""

from __future__ import annotations

import dataclasses
import re

from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.worldmodel.triples import Triple

SYSTEM_PROMPT = (
    "You are a world model of a text-based environment. Given the interaction so far and the "
    "agent's next action, predict the environment's next observation as the environment itself "
    "would write it. Reason briefly inside <think>...</think>, then write the predicted observation "
    "inside <next_state>...</next_state>."
)

_NEXT_STATE = re.compile(r"<next_state>(.*?)</next_state>", re.DOTALL)
_TAGS = ("<think>", "</think>", "<next_state>", "</next_state>")


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    history_window: int = 5  # (observation, action) pairs shown before the current step; the first observation always
    max_chars: int = 4000  # per observation shown (the start is kept: ALFWorld puts the task there)
    enable_thinking: bool = False  # Qwen3 thinking mode in the generation prompt


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + " ..."


def user_text(triple: Triple, cfg: PromptConfig = PromptConfig()) -> str:
    """The prompt's user message: the initial observation, the last `history_window` steps,
    the current observation and the action to predict the outcome of."""
    parts = []
    steps = list(enumerate(triple.history))
    if steps:
        parts.append(f"Initial observation:\n{_clip(steps[0][1][0], cfg.max_chars)}")
        shown = steps[-cfg.history_window:] if cfg.history_window > 0 else []
        if shown and shown[0][0] > 0:
            parts.append(f"({shown[0][0]} earlier steps omitted)")
        for k, (obs, act) in shown:
            if k > 0:
                parts.append(f"Observation {k}:\n{_clip(obs, cfg.max_chars)}")
            parts.append(f"Action {k}: {act}")
        parts.append(f"Current observation:\n{_clip(triple.observation, cfg.max_chars)}")
    else:
        parts.append(f"Initial observation:\n{_clip(triple.observation, cfg.max_chars)}")
    parts.append(f"Next action: {triple.action}\n\nPredict the next observation.")
    return "\n\n".join(parts)


def prompt_ids(chat: Qwen3ChatRenderer, triple: Triple, cfg: PromptConfig = PromptConfig()) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_text(triple, cfg)}]
    return chat.render(messages, add_generation_prompt=True, enable_thinking=cfg.enable_thinking)


def target_ids(chat: Qwen3ChatRenderer, triple: Triple, cfg: PromptConfig = PromptConfig()) -> list[int]:
    """The supervised answer (WM-SFT and the difficulty filter's predictor): the real next state
    in its tags, closed by <|im_end|>."""
    content = f"<next_state>{triple.next_state}</next_state>"
    message = {"role": "assistant", "content": content, "reasoning_content": ""}
    return chat.assistant_completion(message, enable_thinking=cfg.enable_thinking)


def parse_prediction(text: str) -> str | None:
    """The predicted next state, or None when the answer is not exactly one well-formed
    `<next_state>` block after an optional, closed `<think>` block (such answers earn 0)."""
    body = text.strip()
    if body.startswith("<think>"):
        end = body.find("</think>")
        if end < 0:
            return None
        body = body[end + len("</think>"):]
    if "<think>" in body or "</think>" in body:
        return None
    found = _NEXT_STATE.findall(body)
    if len(found) != 1:
        return None
    state = found[0].strip()
    if not state or any(tag in state for tag in _TAGS):
        return None
    if body.count("<next_state>") != 1 or body.count("</next_state>") != 1:
        return None
    return state
