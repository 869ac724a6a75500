"""The environment interface shared by every benchmark adapter and the pool.

An `Env` is stateful and single-threaded (one episode at a time); the pool runs each in its
own process. Model output reaching `step` is untrusted text: adapters parse it (e.g. with
`ast` for tool calls, a tag parser for `<action>`), never `eval` / `exec` it, and answer
unparsable or invalid actions with an observation that says so (`info["invalid"] = True`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, Sequence


@dataclasses.dataclass(frozen=True)
class Task:
    """One episode's specification. Rollouts of a GRPO group share the same Task (and seed)."""

    env: str  # adapter name: "sciworld" | "bfcl" | "alfworld" | "tau2"
    task_id: str  # unique within (env, split)
    split: str  # the catalogue split it came from
    seed: int = 0
    spec: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # adapter-specific
    # The stratum evaluation balances over and reports by (ScienceWorld task type, BFCL
    # category, ALFWorld task type, tau2 domain); "" for an env without one.
    category: str = ""
    # Further strata reported like categories (`eval/success_<env>/<tag>`) but neither balanced
    # over nor averaged into `eval/score`: BFCL's difficulty tier ("tier_easy", ...).
    tags: tuple[str, ...] = ()


@dataclasses.dataclass
class Observation:
    """What the agent sees (`text`, `system_prompt`) and, separately, what only the feedback
    layer (and the scripted gold / explorer policies) may use (`privileged`)."""

    text: str
    # e.g. "gold_actions", "goal_progress", "valid_actions", "tool_results", "turn"
    privileged: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The agent's system prompt, set on a reset observation by envs with per-task instructions
    # (BFCL's function docs, tau2's policy and tools); None: the env's template (`prompts`).
    system_prompt: str | None = None


@dataclasses.dataclass
class StepResult:
    observation: Observation
    reward: float
    done: bool
    # e.g. "won", "score", "invalid" (the action could not be parsed or executed), "steps"
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The action the env read from the agent's text (e.g. the content of `<action>` tags), as
    # feedback that follows a gold path and world-model triples compare it; None: the text as
    # written (stripped).
    action: str | None = None


class Env(Protocol):
    """A single-episode text environment."""

    name: str

    def reset(self, task: Task) -> Observation: ...

    def step(self, action_text: str) -> StepResult: ...

    def close(self) -> None: ...


class EnvError(RuntimeError):
    """An environment failed for infrastructure reasons (crash, hang, missing dependency),
    as opposed to the agent doing something invalid."""


@dataclasses.dataclass(frozen=True)
class EpisodeFailure:
    """An episode that failed for infrastructure reasons (never a reward); exclude it from
    the batch."""

    reason: str  # human-readable: "<exception type>: <message>" for an env that raised
    kind: str  # "timeout" | "crash" | "lost" | "error"
    episode: int
    task: Task | None = None
    worker: int | None = None  # the pool's worker process (None in process)


def is_failure(x: object) -> bool:
    return isinstance(x, EpisodeFailure)


class EnvBatch(Protocol):
    """One episode per task, stepped together: `jaxscaffold.envs.pool.EnvPool` (worker
    processes) and `jaxscaffold.envs.local.LocalEnvs` (this process) implement it alike.

    Episodes are indexed by their position in the last `reset`'s tasks; an env that raises
    (any exception) fails its episode as `EpisodeFailure(kind="error")`, and a failed
    episode's later steps return that failure again."""

    def reset(self, tasks: Sequence[Task]) -> list[Observation | EpisodeFailure]: ...

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult | EpisodeFailure]: ...

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Everything the package needs to know of an environment, declared once, beside the env:
    its module's `SPEC` (a module that needs an optional dependency when imported keeps its
    spec in a light module of its own, as tau2's `tau2_spec`), so the registry lists an env
    without its dependencies, which only matter when the env is built (and then say how to
    install them). Feedback's side of an env (its AG / OE forms, the unit its windows count,
    hooks run inside the env) is registered by feedback, keyed by the same name
    (`feedback.enrichers.FeedbackSpec`): envs know nothing of feedback.

    `module` (importable, e.g. your own `mypkg.myenv`) defines `catalogue(split) -> [Task]`
    (each Task's `category`, if set, is what evaluation sets balance over and scores report by)
    and `env_class` (the Env protocol above), which pool workers construct from its import path
    with the run's `envs.env_kwargs` for this env."""

    name: str
    module: str
    env_class: str
    catalogue: str = "catalogue"  # the module's function: split -> [Task]
    splits: tuple[str, ...] | None = None  # what `split` may be (None: any; the catalogue says)
    # "GROUP/split" splits: each group (sciworld's levels, tau2's domains) -> its splits (empty: `splits`)
    split_groups: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    group_label: str = "group"  # what a group is called in errors ("level", "domain")
    path_suffix: str = ""  # the split is a path to a file ending so (jsonl: ".jsonl")
    extra: str | None = None  # the pip extra that provides the module's dependencies
    system_prompt: str | None = None  # the agent's (else the env's reset observations carry theirs)
    # The module's function returning every text the env writes (its templates, object names):
    # what a word-level vocabulary of the env (`model.vocabulary`) is built from.
    vocabulary: str | None = None
    # What builds the env from the run's kwargs: the class itself (""), or its attribute, e.g. a
    # classmethod that gathers them into the env's options object ("from_kwargs").
    constructor: str = ""
    # Whether instances may run at once in threads of one pool worker (each its own state: no
    # module state shared between instances, no thread-unsafe library). False: a worker runs
    # this env's requests one at a time (CPU-bound envs lose nothing by it: threads share a core).
    concurrent: bool = True

    @property
    def import_path(self) -> str:
        """"module:Class" (or "module:Class.constructor"), what a pool worker imports and calls
        with the run's kwargs to build the env."""
        return f"{self.module}:{self.env_class}" + (f".{self.constructor}" if self.constructor else "")
