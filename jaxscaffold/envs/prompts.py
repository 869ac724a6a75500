"""Agent prompt templates, one place for every environment.

The system prompt tells the agent the task format; observations become user turns as they
are (environment text is data: the chat renderer encodes it with special tokens disabled).
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

ACTION_FORMAT = ("Think step by step inside <think>...</think>, then give exactly one action "
                 "inside <action>...</action>.")

SYSTEM_PROMPTS = {
    "letters": "You are a writer. Answer with text only.",
    "sciworld": "You are an agent in ScienceWorld, a text-based science laboratory. " + ACTION_FORMAT,
    "alfworld": "You are an agent in a household (ALFWorld). " + ACTION_FORMAT,
    "rooms": "You are an agent in a house of coloured rooms. Reply with one action.",
    "bfcl": "You are an assistant that completes the user's requests by calling the provided functions.",
    # The generic part only: the full tau2 prompt (its policy, tools) is per task, see below.
    "tau2": ("You are a customer service agent that helps the user according to the domain "
             "policy. In each turn either write a message to the user or call tools inside "
             "<tool_call>...</tool_call>; tool results come back inside "
             "<tool_response>...</tool_response>."),
}

# Qwen3's tool-call format (as its chat template writes it), appended to tau2's own text.
_TAU2_TOOLS = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query. The "
    "functions are described by the JSON schemas inside <tools></tools>:\n<tools>\n{tools}\n"
    "</tools>\n\nTo call a function, write a JSON object with its name and arguments inside "
    "<tool_call></tool_call> tags, one block per call:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>\n'
    "A message without <tool_call> blocks is sent as it is to the other side of the conversation.")


def tau2_system_prompt(instructions: str, tools: Sequence[Mapping]) -> str:
    """A tau2 episode's system prompt: tau2's own instructions and domain policy (the text of
    its LLMAgent / LLMSoloAgent / user simulator prompts) plus the tool schemas in Qwen3's
    `<tools>` / `<tool_call>` format."""
    if not tools:
        return instructions
    block = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return instructions + _TAU2_TOOLS.format(tools=block)


def system_prompt(env: str) -> str:
    if env not in SYSTEM_PROMPTS:
        raise KeyError(f"no prompt template for environment {env!r}; known: {sorted(SYSTEM_PROMPTS)}")
    return SYSTEM_PROMPTS[env]


def history_window_text(first: str, history: Sequence[tuple[str, str]], current: str, step: int) -> str:
    """The reference code's step-wise user prompt, rebuilt every step: the task (the first
    observation), how many steps were taken, the last few (observation, action) pairs, and
    the current observation. `history` is the window already cut (oldest first)."""
    if step == 0:
        return current
    parts = [f"Your task and the first observation:\n{first}",
             f"You have taken {step} step(s) so far."]
    if history:
        start = step - len(history)
        lines = [f"[Step {start + k + 1}] observation: {obs}\n[Step {start + k + 1}] your action: {act}"
                 for k, (obs, act) in enumerate(history)]
        parts.append(f"The last {len(history)} step(s):\n" + "\n".join(lines))
    parts.append(f"Current observation (step {step + 1}):\n{current}")
    return "\n\n".join(parts)
