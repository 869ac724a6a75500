"""Word-level vocabularies of the testbeds (`model.vocabulary`): every word a run's chats hold,
so a from-scratch model on a `WordTokenizer` of a few hundred ids sees no unknown word.

A vocabulary is composed here, where envs and feedback meet the model: the env's own texts,
its system prompt, the text its enrichers add, and the action markup an agent may write.
"""

from __future__ import annotations

import functools

from jaxscaffold.envs.base import Observation
from jaxscaffold.envs.prompts import history_window_text, system_prompt
from jaxscaffold.models.word_tokenizer import WordTokenizer

ACTION_MARKUP = ("<action></action>",)  # an agent may wrap its action (the envs' shared parser)


def _feedback_texts(env: str) -> tuple[str, ...]:
    """What the env's enrichers add, shown on an observation with every privileged field set."""
    from jaxscaffold.feedback import enrichers

    obs = Observation("", {"next_walkthrough_action": "look", "gold_actions": ["look"],
                           "goals": [{"description": "look", "done": True}, {"description": "look", "done": False}]})
    return tuple(form(obs, []) for kind in ("ag", "oe") for form in enrichers.FORMS.get((env, kind), {}).values())


# The step-wise rows' user prompt (`rollout.representation=stepwise`) around the observations: its
# labels, with a history window of one so that every label is rendered.
STEPWISE_LABELS = (history_window_text("", [("", "")], "", 1),)


def _rooms_texts() -> tuple[str, ...]:
    from jaxscaffold.envs import rooms

    return (rooms.vocabulary_texts() + (system_prompt("rooms"),) + _feedback_texts("rooms") + STEPWISE_LABELS
            + ACTION_MARKUP)


def _world_model_texts() -> tuple[str, ...]:
    """What RWML's stage 1 adds to a chat: its system prompt, the prompt's labels (a triple
    with history renders every one), the answer's tags."""
    from jaxscaffold.worldmodel import task
    from jaxscaffold.worldmodel.triples import Triple

    triple = Triple("", "", (("o", "a"), ("o", "a")), "o", "a", "s")
    labels = task.user_text(triple, task.PromptConfig(history_window=1))
    return (task.SYSTEM_PROMPT, labels, "<next_state></next_state>")


def _rooms_wm_texts() -> tuple[str, ...]:
    """The rooms run's words and RWML's: one vocabulary for both stages (and their baselines),
    so a stage-1 checkpoint continues in stage 2 with the same ids."""
    return _rooms_texts() + _world_model_texts()


VOCABULARIES = {"rooms": _rooms_texts, "rooms_wm": _rooms_wm_texts}


@functools.lru_cache(maxsize=None)
def word_tokenizer(name: str) -> WordTokenizer:
    """The `WordTokenizer` of vocabulary `name` (a key of VOCABULARIES)."""
    if name not in VOCABULARIES:
        raise KeyError(f"unknown vocabulary {name!r}; known: {', '.join(VOCABULARIES)}")
    return WordTokenizer(VOCABULARIES[name]())
