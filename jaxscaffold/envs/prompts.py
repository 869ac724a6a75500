"""Agent prompt templates, one place for every environment.

The system prompt tells the agent the task format; observations become user turns as they
are (environment text is data: the chat renderer encodes it with special tokens disabled).
"""

from __future__ import annotations

ACTION_FORMAT = ("Think step by step inside <think>...</think>, then give exactly one action "
                 "inside <action>...</action>.")

SYSTEM_PROMPTS = {
    "letters": "You are a writer. Answer with text only.",
    "sciworld": "You are an agent in ScienceWorld, a text-based science laboratory. " + ACTION_FORMAT,
    "alfworld": "You are an agent in a household (ALFWorld). " + ACTION_FORMAT,
    "bfcl": "You are an assistant that completes the user's requests by calling the provided functions.",
}


def system_prompt(env: str) -> str:
    if env not in SYSTEM_PROMPTS:
        raise KeyError(f"no prompt template for environment {env!r}; known: {sorted(SYSTEM_PROMPTS)}")
    return SYSTEM_PROMPTS[env]
