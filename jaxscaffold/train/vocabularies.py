"""Word-level vocabularies of the testbeds (`model.vocabulary`): every word a run's chats hold,
so a from-scratch model on a `WordTokenizer` of a few hundred ids sees no unknown word.

A vocabulary is composed here, where envs and feedback meet the model: the env's own texts (its
`EnvSpec.vocabulary`), its system prompt, the text its feedback forms add, and the action markup
an agent may write. Every env that declares its texts has one, named after it (`rooms`), and
one with RWML's world-model prompt too (`rooms_wm`).
"""

from __future__ import annotations

import functools
from typing import Callable

from jaxscaffold.envs import registry
from jaxscaffold.envs.base import Observation
from jaxscaffold.envs.prompts import history_window_text, system_prompt
from jaxscaffold.feedback import enrichers
from jaxscaffold.models.word_tokenizer import WordTokenizer

ACTION_MARKUP = ("<action></action>",)  # an agent may wrap its action (the envs' shared parser)
WORLD_MODEL_SUFFIX = "_wm"


def _feedback_texts(env: str) -> tuple[str, ...]:
    """What the env's enrichers add, shown on an observation with every privileged field set."""
    obs = Observation("", {"next_walkthrough_action": "look", "gold_actions": ["look"],
                           "goals": [{"description": "look", "done": True}, {"description": "look", "done": False}]})
    spec = enrichers.FEEDBACK.get(env, enrichers.FeedbackSpec({}))
    return tuple(form(obs, []) for kind in enrichers.KINDS for form in spec.forms.get(kind, {}).values())


# The step-wise rows' user prompt (`rollout.representation=stepwise`) around the observations: its
# labels, with a history window of one so that every label is rendered.
STEPWISE_LABELS = (history_window_text("", [("", "")], "", 1),)


def env_texts(env: str) -> tuple[str, ...]:
    """Every text a run on `env` shows or writes: the env's own, its system prompt, its
    feedback's, the step-wise labels and the action markup."""
    return (registry.vocabulary_texts(env) + (system_prompt(env),) + _feedback_texts(env) + STEPWISE_LABELS
            + ACTION_MARKUP)


def _world_model_texts() -> tuple[str, ...]:
    """What RWML's stage 1 adds to a chat: its system prompt, the prompt's labels (a triple
    with history renders every one), the answer's tags."""
    from jaxscaffold.worldmodel import task
    from jaxscaffold.worldmodel.triples import Triple

    triple = Triple("", "", (("o", "a"), ("o", "a")), "o", "a", "s")
    labels = task.user_text(triple, task.PromptConfig(history_window=1))
    return (task.SYSTEM_PROMPT, labels, "<next_state></next_state>")


def vocabularies() -> dict[str, Callable[[], tuple[str, ...]]]:
    """Vocabulary name -> its texts, for every registered env that declares its texts: the env's
    words, and with `_wm` RWML's too (one vocabulary for both stages and their baselines, so a
    stage-1 checkpoint continues in stage 2 with the same ids)."""
    out = {}
    for name, spec in registry.ENVS.items():
        if spec.vocabulary is not None:
            out[name] = functools.partial(env_texts, name)
            out[name + WORLD_MODEL_SUFFIX] = functools.partial(lambda n: env_texts(n) + _world_model_texts(), name)
    return out


VOCABULARIES = vocabularies()  # the built-in envs' (what configs are checked against)


@functools.lru_cache(maxsize=None)
def word_tokenizer(name: str) -> WordTokenizer:
    """The `WordTokenizer` of vocabulary `name` (see `vocabularies`)."""
    known = vocabularies()
    if name not in known:
        raise KeyError(f"unknown vocabulary {name!r}; known: {', '.join(known)}")
    return WordTokenizer(known[name]())
