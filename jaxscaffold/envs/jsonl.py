"""Your own prompts as an environment: tasks from a JSONL file, scored by a reward function
(as TRL's reward functions or verl's `reward_fn`), with no env code to write.

One JSON object a line; `prompt` is required, every field reaches the reward function:

    {"id": "add-1", "prompt": "What is 17 + 25?", "answer": "42", "category": "addition"}

Task spec: `jsonl:PATH[:N]`, PATH a `.jsonl` file (relative to the working directory), e.g.
`envs.train = "jsonl:data/train.jsonl"`, `envs.eval = "jsonl:data/test.jsonl:64"`. The env's
options come through `envs.env_kwargs`, e.g. `'{"jsonl": {"reward": "myrewards:score"}}'`:

  reward        a registered reward's name (`exact_match`, `last_number`, or one that code
                registered with `register_reward`), or "module:function" (the config is the
                user's own code: importing the module also runs its `register_reward` calls);
                called as `function(answer, item) -> float` with the model's answer (its
                reasoning removed) and the line's dict; default `exact_match`. A line's own
                "reward" field overrides it, and may only be a registered name: data never
                names code to import (an unknown name is a one-line error when the file loads).
  success       the reward at which a task counts as solved (default 1.0)
  max_attempts  turns per episode: a reply below `success` is told "Not correct; try again."
                until the attempts are spent (default 1: one answer, one reward)
  system_prompt the agent's system prompt

The episode's reward is its best attempt's. Model output is untrusted text: the reward
functions here only compare strings; yours must not evaluate it either.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
import unicodedata
from typing import Callable

from jaxscaffold.envs.actions import strip_reasoning
from jaxscaffold.envs.base import EnvError, EnvSpec, Observation, StepResult, Task

NAME = "jsonl"
SPEC = EnvSpec(NAME, __name__, "JsonlEnv", path_suffix=".jsonl")  # a split is a path to a .jsonl file
SYSTEM_PROMPT = "You are a helpful assistant. Answer the question; give the final answer only."
RETRY = "Not correct; try again."
_MAX_ANSWER_CHARS = 10_000  # of the model's answer passed to a reward function
MAX_PROMPT_CHARS = 1_000_000  # a task's prompt (about 250k tokens: more than any context)
_NEED_ANSWER = ("exact_match", "last_number")  # the built-in rewards compare with the line's "answer"

log = logging.getLogger(__name__)

Reward = Callable[[str, dict], float]


# ----------------------------------------------------------------------------- rewards


def normalise(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed, trailing period dropped."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).rstrip(".")


def exact_match(answer: str, item: dict) -> float:
    """1.0 when the answer equals the item's "answer" (or one of a list of them), normalised."""
    golds = item.get("answer")
    golds = golds if isinstance(golds, list) else [golds]
    return float(any(normalise(answer) == normalise(str(g)) for g in golds if g is not None))


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def last_number(answer: str, item: dict) -> float:
    """1.0 when the last number in the answer equals the item's numeric "answer" (to 1e-6
    relative; thousands separators allowed): the usual math-word-problem check."""
    found = _NUMBER.findall(answer)
    if not found:
        return 0.0
    try:
        got, want = float(found[-1].replace(",", "")), float(str(item.get("answer")).replace(",", ""))
    except ValueError:
        return 0.0
    return float(math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9))


REWARDS: dict[str, Reward] = {"exact_match": exact_match, "last_number": last_number}


def register_reward(name: str, fn: Reward) -> None:
    """Makes `fn` a reward that a task line (`"reward": name`) or the config may name."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"jsonl reward name {name!r}: a non-empty name without ':'")
    if not callable(fn):
        raise ValueError(f"jsonl reward {name!r}: {fn!r} is not callable")
    REWARDS[name] = fn


def registered_reward(name: str) -> Reward:
    """A registered reward by name (what a task line may name): a one-line error otherwise."""
    fn = REWARDS.get(name) if isinstance(name, str) else None
    if fn is None:
        raise ValueError(f"jsonl reward {name!r} is not registered (registered: {', '.join(sorted(REWARDS))}; "
                         "register yours with jaxscaffold.envs.jsonl.register_reward)")
    return fn


def config_reward(path: str) -> Reward:
    """The config's reward (`env_kwargs` "reward"): a registered name, or "module:function" of
    the user's own code. Never called with a task line's or the model's text."""
    if ":" not in path:
        return registered_reward(path)
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"jsonl reward {path!r}: expected a registered name or 'module:function'")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"jsonl reward {path!r} cannot be imported ({type(e).__name__}: {e})") from None
    if not callable(fn):
        raise ValueError(f"jsonl reward {path!r} is not callable")
    return fn


# ----------------------------------------------------------------------------- tasks


def read_items(path: str) -> list[dict]:
    """The file's objects, in order; a bad line is a one-line error naming file and line."""
    if not path.endswith(".jsonl"):
        raise ValueError(f"jsonl split {path!r}: expected a path to a .jsonl file (jsonl:PATH[:N])")
    if not os.path.isfile(path):
        raise ValueError(f"jsonl task file not found: {os.path.abspath(path)}")
    items = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
                raise ValueError(f"{path}:{number}: each line needs a non-empty string \"prompt\"")
            if len(item["prompt"]) > MAX_PROMPT_CHARS:  # refused before anything tokenises it
                raise ValueError(f"{path}:{number}: a prompt of {len(item['prompt']):,} characters exceeds "
                                 f"{MAX_PROMPT_CHARS:,} (beyond any context a run holds)")
            if "reward" in item:  # a name of the registry, never code to import
                try:
                    registered_reward(item["reward"])
                except ValueError as e:
                    raise ValueError(f"{path}:{number}: {e}") from None
            items.append({"id": str(number), **item})
    if not items:
        raise ValueError(f"jsonl task file {path} holds no task (one JSON object a line)")
    unanswered = [i["id"] for i in items if "answer" not in i and i.get("reward", "exact_match") in _NEED_ANSWER]
    if unanswered:
        log.warning("%s: %d of %d tasks have no \"answer\" (e.g. id %s): exact_match / last_number score them 0 "
                    "unless the config's reward needs none", path, len(unanswered), len(items), unanswered[0])
    ids = [str(i["id"]) for i in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"{path}: task id {dup!r} appears more than once")
    return items


def catalogue(split: str) -> list[Task]:
    """The tasks of a JSONL file (`split` is its path)."""
    return [Task(NAME, str(item["id"]), split, seed=i, category=str(item.get("category", "")), spec={"item": item})
            for i, item in enumerate(read_items(split))]


# ----------------------------------------------------------------------------- the env


class JsonlEnv:
    """Single- or multi-attempt question answering over JSONL tasks."""

    name = NAME

    def __init__(self, reward: str = "exact_match", success: float = 1.0, max_attempts: int = 1,
                 system_prompt: str = SYSTEM_PROMPT):
        if max_attempts < 1:
            raise ValueError(f"jsonl max_attempts must be >= 1, got {max_attempts}")
        self.default_reward, self.success = config_reward(reward), float(success)
        self.max_attempts, self.system_prompt = int(max_attempts), system_prompt
        self._item: dict | None = None
        self._reward: Reward | None = None
        self._attempts, self._best = 0, 0.0

    def reset(self, task: Task) -> Observation:
        self._item = dict(task.spec["item"])
        own = self._item.get("reward")
        self._reward = registered_reward(own) if own is not None else self.default_reward
        self._attempts, self._best = 0, 0.0
        return Observation(self._item["prompt"], privileged={"item": self._item}, system_prompt=self.system_prompt)

    def step(self, action_text: str) -> StepResult:
        if self._item is None:
            raise RuntimeError("step() before reset()")
        answer = strip_reasoning(action_text).strip()[:_MAX_ANSWER_CHARS]
        reward = self._score(answer)
        self._attempts += 1
        self._best = max(self._best, reward)
        won = reward >= self.success
        done = won or self._attempts >= self.max_attempts
        text = "Correct." if won else ("Episode over." if done else RETRY)
        info = {"won": self._best >= self.success, "score": self._best, "attempts": self._attempts}
        return StepResult(Observation(text), reward=self._best if done else 0.0, done=done, info=info, action=answer)

    def _score(self, answer: str) -> float:
        try:
            value = self._reward(answer, dict(self._item))
        except Exception as e:  # the user's function failed: an infrastructure error, not a reward
            raise EnvError(f"jsonl reward function raised {type(e).__name__}: {e}") from e
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise EnvError(f"jsonl reward function returned {value!r}; expected a finite number")
        return float(value)

    def close(self) -> None:
        pass
