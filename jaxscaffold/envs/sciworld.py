"""ScienceWorld (PyPI ``scienceworld``) behind the `Env` interface, as the FEE lineage uses it.

Episode: ``reset(task)`` loads ``task.spec["task_name"]`` / ``task.spec["variation"]`` with the
gold path generated; each ``step(text)`` parses ``<action>...</action>`` from the model output
(`jaxscaffold.envs.actions.parse_action`) and sends only the extracted action string to the
simulator (never evaluated). The simulator is deterministic given (task, variation), so
`Task.seed` is not used.

Rules of an episode (reference-code defaults):
- reward ``reward_scale * won`` (default 10), ``won = completed and score > 0``; the 0-100
  score goes to ``info["score"]``;
- ``focus on`` a wrong object makes the score -100: the episode ends as a failure
  (``info["failed"] = True``, reward 0), never a negative reward;
- ``step_limit`` agent turns (default 15) end the episode (``info["truncated"] = True``);
- an output with no parsable action is answered with an invalid-action observation
  (``info["invalid"] = True``, ``info["parse_error"]``): nothing is sent to the simulator,
  but the turn counts toward ``step_limit`` (so a model cannot stall an episode forever);
- an action the simulator does not know ("No known action matches that input.") is a
  simulator step that changes nothing; it is flagged ``info["invalid"] = True`` too.

Observation text: the task description (at reset), the simulator's output, the action
templates (``get_possible_actions()``) and the visible objects (``get_possible_objects()``);
never the full list of valid action/object combinations, which is most of the cost of the
stock ``ScienceWorldEnv.step``. Valid actions are computed only on demand:
`ScienceWorldEnv.valid_actions()` (also callable through ``EnvPool.call``), or every turn with
``include_valid_actions=True``. Steps go through the simulator's raw ``server.step`` plus the
few getters needed (score, completion); ``stock_step=True`` uses the package's ``step()``
instead (for comparison).

``Observation.privileged`` (feedback layer only): ``gold_actions`` (the full gold path),
``ag_actions`` (the reference code's action-guidance form: the gold path with
``open door to X`` dropped when the next action is ``go to X``, first 3), ``goal_progress``
(raw ``get_goal_progress()`` text), ``goals`` (that text parsed: sequential and optional
subgoals with their done flags; the same data as ``agentInterface().get().task()
.goalSequence()``, read in one call instead of one py4j round trip per goal), ``score``,
``turn``, ``task_name``, ``variation``, ``task_description``, ``observation`` (raw),
``action_templates``, ``objects`` and, when requested, ``valid_actions``. With an AG guide
(``ag_guide``, FEE's action guidance: `jaxscaffold.feedback.sciworld_ag.GoldGuide`, wired by
`jaxscaffold.feedback.enrichers.env_kwargs`), also ``ag_hint`` (an action valid at that moment,
re-derived from the current state once the agent has left the gold path, or None) and
``ag_hint_source``; the hint is computed (one valid-action listing) only on the episode steps
the task's feedback plan asks for (``task.spec["feedback"]["ag"]``: ``[first, last]`` windows
of actions taken, or None for every step; set per episode by `jaxscaffold.feedback.apply`),
elsewhere ``ag_hint`` is None with source ``"not_requested"``.

Catalogue: `catalogue(split, level=...)` lists Tasks: ``level="official"`` gives the env's own
``train`` / ``dev`` / ``test`` variations; ``level="L0" | "L1" | "L2"`` the FEE/RLVMR splits
(``train`` / ``test``) from ``<data>/sciworld/L*_idx.json``. The task names and official
variations come from a JVM once and are cached as JSON under ``$JAXSCAFFOLD_CACHE`` (default
``~/.cache/jaxscaffold``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pathlib
import re
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, Sequence

from jaxscaffold.cache import default_cache_root
from jaxscaffold.envs.actions import invalid_action_message, parse_action
from jaxscaffold.envs.base import EnvError, EnvSpec, Observation, StepResult, Task

logger = logging.getLogger(__name__)

ENV_NAME = "sciworld"
DEFAULT_JVM_OPTS: tuple[str, ...] = ("-Xmx256m", "-XX:+UseSerialGC")
UNKNOWN_ACTION_TEXT = "No known action matches that input."
LEVELS = ("official", "L0", "L1", "L2")
LEVEL_SPLITS = {"official": ("train", "dev", "test"), "L0": ("train", "test"),
           "L1": ("train", "test"), "L2": ("train", "test")}
# "L1/test": a level and its split; a bare split is the default level L0's (the FEE reference
# code's lists).
# Concurrent in a pool worker: each instance drives its own JVM through its own py4j gateway
# (JVM launches take `_launch_lock`).
SPEC = EnvSpec(ENV_NAME, __name__, "ScienceWorldEnv", splits=LEVEL_SPLITS["L0"], split_groups=LEVEL_SPLITS,
               group_label="level", extra="envs")
# The split files ship with the package (data/sciworld/SOURCE.md: provenance);
# $JAXSCAFFOLD_DATA/sciworld overrides them.
_PACKAGE_DATA = pathlib.Path(__file__).resolve().parent / "data" / "sciworld"

_launch_lock = threading.Lock()


# ----------------------------------------------------------------------------- helpers


def ag_actions(gold: Sequence[str], k: int = 3) -> list[str]:
    """The reference code's action guidance: the gold path without ``open door to X`` when the
    next action is ``go to X``, first `k` actions (filtering first, then taking k)."""
    kept: list[str] = []
    for i, act in enumerate(gold):
        a = act.strip()
        if a.startswith("open door to ") and i + 1 < len(gold):
            if gold[i + 1].strip() == "go to " + a[len("open door to "):]:
                continue
        kept.append(a)
    return kept[:k]


_GOAL_LINE = re.compile(r"^\s*(\d+)\s+(true|false)\s+(\S+)\s+(.*?)\s*$", re.IGNORECASE)


def parse_goal_progress(text: str) -> dict[str, Any]:
    """Parse ``get_goal_progress()`` text into ``{"sequential": [...], "optional": [...],
    "completed_keys": str}``; each goal is ``{"index", "done", "type", "description"}``."""
    out: dict[str, Any] = {"sequential": [], "optional": [], "completed_keys": ""}
    section: str | None = None
    for line in text.splitlines():
        low = line.strip().lower()
        if low.startswith("completed keys:"):
            out["completed_keys"] = line.split(":", 1)[1].strip()
            continue
        if low.startswith("sequential subgoals"):
            section = "sequential"
            continue
        if low.startswith("unordered and optional subgoals"):
            section = "optional"
            continue
        m = _GOAL_LINE.match(line)
        if m and section:
            out[section].append({"index": int(m.group(1)), "done": m.group(2).lower() == "true",
                                 "type": m.group(3), "description": m.group(4)})
    return out


def _data_dir() -> pathlib.Path:
    env = os.environ.get("JAXSCAFFOLD_DATA")
    return pathlib.Path(env) / "sciworld" if env else _PACKAGE_DATA


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("scienceworld")
    except Exception:  # pragma: no cover - metadata missing
        return "unknown"


def _start_simulator(jvm_opts: Sequence[str]):
    """A package `ScienceWorldEnv` whose JVM gets `jvm_opts` (the package exposes no option
    for it: its module-level ``launch_gateway`` is wrapped for the duration of the call)."""
    try:
        import scienceworld.scienceworld as sw_mod
    except ImportError as e:  # pragma: no cover - dependency missing
        raise EnvError("PyPI package 'scienceworld' is not installed") from e
    with _launch_lock:
        original = sw_mod.launch_gateway
        sw_mod.launch_gateway = functools.partial(original, javaopts=list(jvm_opts))
        try:
            return sw_mod.ScienceWorldEnv("", envStepLimit=1_000_000)
        except Exception as e:
            raise EnvError(f"could not start the ScienceWorld JVM: {e}") from e
        finally:
            sw_mod.launch_gateway = original


def _stop_simulator(sim) -> None:
    proc = getattr(getattr(sim, "_gateway", None), "java_process", None)
    try:
        sim.close()
    except Exception:  # the JVM may already be gone
        pass
    sim.close = lambda: None  # its __del__ would shut the gateway down a second time
    if proc is not None:
        try:
            proc.wait(timeout=5)
        except Exception:
            try:
                proc.kill()
                proc.wait(timeout=5)
            except Exception:
                pass


def ag_windows(spec) -> list[tuple[int, int]] | None:
    """The episode steps (actions taken) the task's feedback plan wants AG hints on:
    ``[(first, last), ...]``, None for every step, [] for none (no AG planned)."""
    plan = (spec.get("feedback") or {})
    if "ag" not in plan:
        return []
    windows = plan["ag"]
    return None if windows is None else [(int(a), int(b)) for a, b in windows]


def resolve_callable(obj):
    """A callable, or a "package.module:attr" import path to one (picklable for the pool)."""
    if obj is None or callable(obj):
        return obj
    if isinstance(obj, str) and ":" in obj:
        import importlib

        module, attr = obj.split(":", 1)
        return functools.reduce(getattr, attr.split("."), importlib.import_module(module))
    raise TypeError(f"expected a callable or a 'module:attr' path, got {obj!r}")


# ----------------------------------------------------------------------------- catalogue


def _variation_cache_path() -> pathlib.Path:
    return default_cache_root() / f"sciworld_variations_{_package_version()}.json"


def build_variation_cache(path: str | os.PathLike | None = None,
                          jvm_opts: Sequence[str] = DEFAULT_JVM_OPTS) -> dict[str, Any]:
    """Start one JVM, list the task names and each task's official train/dev/test
    variations, and write them (atomically) to the cache JSON. Returns the data."""
    path = pathlib.Path(path) if path else _variation_cache_path()
    t0 = time.time()
    sim = _start_simulator(jvm_opts)
    try:
        names = sim.get_task_names()
        tasks = {}
        for name in names:
            sim.load(name, 0, "", generateGoldPath=False)
            tasks[name] = {
                "max_variations": int(sim.get_max_variations(name)),
                "train": [int(v) for v in sim.get_variations_train()],
                "dev": [int(v) for v in sim.get_variations_dev()],
                "test": [int(v) for v in sim.get_variations_test()],
            }
    finally:
        _stop_simulator(sim)
    data = {"scienceworld": _package_version(), "task_names": names, "tasks": tasks}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
    logger.info("built ScienceWorld variation cache %s in %.1fs", path, time.time() - t0)
    return data


@functools.lru_cache(maxsize=None)
def _variation_data(path: str) -> dict[str, Any]:
    p = pathlib.Path(path)
    if p.exists():
        try:
            with open(p) as f:
                return json.load(f)
        except (OSError, json.JSONDecodeError):
            logger.warning("unreadable ScienceWorld cache %s: rebuilding", p)
    return build_variation_cache(p)


def variation_data() -> dict[str, Any]:
    """``{"task_names": [...30], "tasks": {name: {"train", "dev", "test", "max_variations"}}}``
    (built with a JVM on first use, then read from the cache)."""
    return _variation_data(str(_variation_cache_path()))


def task_names() -> list[str]:
    """The simulator's task names in ``get_task_names()`` order (the L*_idx.json ids)."""
    return list(variation_data()["task_names"])


def make_task(task_name: str, variation: int, split: str, level: str = "official") -> Task:
    return Task(env=ENV_NAME, task_id=f"{task_name}/{int(variation)}", split=f"{level}/{split}",
                spec={"task_name": task_name, "variation": int(variation), "level": level}, category=task_name)


def catalogue(split: str, *, level: str = "L0",
              tasks: Iterable[str | int] | None = None) -> list[Task]:
    """Tasks of one split. ``level="official"``: the env's ``train`` / ``dev`` / ``test``
    variations of every task; ``level="L0" | "L1" | "L2"``: the reference code's ``train`` /
    ``test`` lists. `tasks` optionally restricts to task names or indices. Order: as listed
    (official: task order, then variation). `split` may name its level too, "L1/test" (what a
    task spec or `launch/eval.py --split` can carry)."""
    if "/" in split:
        level, split = split.split("/", 1)
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if split not in LEVEL_SPLITS[level]:
        raise ValueError(f"split of level {level} must be one of {LEVEL_SPLITS[level]}, got {split!r}")
    data = variation_data()
    names = data["task_names"]
    keep: set[str] | None = None
    if tasks is not None:
        keep = {names[t] if isinstance(t, int) else t for t in tasks}
        unknown = keep - set(names)
        if unknown:
            raise ValueError(f"unknown ScienceWorld tasks: {sorted(unknown)}")
    out: list[Task] = []
    if level == "official":
        for name in names:
            if keep is None or name in keep:
                out.extend(make_task(name, v, split, level) for v in data["tasks"][name][split])
        return out
    path = _data_dir() / f"{level}_idx.json"
    if not path.exists():
        raise FileNotFoundError(f"ScienceWorld split file not found: {path} ($JAXSCAFFOLD_DATA/sciworld "
                                f"overrides the package's own {_PACKAGE_DATA}; unset it or add the file)")
    with open(path) as f:
        pairs = json.load(f)[split]
    for task_idx, var in pairs:
        name = names[int(task_idx)]
        if keep is None or name in keep:
            out.append(make_task(name, var, split, level))
    return out


# ----------------------------------------------------------------------------- the env


class ScienceWorldEnv:
    """One ScienceWorld episode at a time, on its own JVM (started at the first reset,
    reused across resets, stopped by `close`). Not thread-safe: one per process or thread."""

    name = ENV_NAME
    #: methods `EnvPool.call` may invoke on an episode's env
    POOL_METHODS = ("valid_actions", "goal_progress", "jvm_pid")

    def __init__(self, *, step_limit: int = 15, reward_scale: float = 10.0,
                 simplifications: str = "", jvm_opts: Sequence[str] = DEFAULT_JVM_OPTS,
                 include_valid_actions: bool = False, stock_step: bool = False,
                 ag_k: int = 3, max_action_chars: int = 512, allow_unclosed: bool = False,
                 ag_guide: Callable | str | None = None):
        self.step_limit = int(step_limit)
        self.reward_scale = float(reward_scale)
        self.simplifications = simplifications
        self.jvm_opts = tuple(jvm_opts)
        self.include_valid_actions = include_valid_actions
        self.stock_step = stock_step
        self.ag_k = ag_k
        self._parse_kw = {"max_action_chars": max_action_chars, "allow_unclosed": allow_unclosed}
        # (gold actions, first observation) -> a guide with observe(action, raw) and hint_at(sim, raw)
        self.ag_guide = resolve_callable(ag_guide)
        self._guide = None
        self._ag_windows: list | None = []
        self._sim = None
        self._task: Task | None = None
        self._done = True
        self._turn = 0
        self._gold: list[str] = []
        self._ag: list[str] = []
        self._desc = ""
        self._templates: list[str] = []

    # -- lifecycle

    def _simulator(self):
        if self._sim is None:
            self._sim = _start_simulator(self.jvm_opts)
        return self._sim

    def jvm_pid(self) -> int | None:
        proc = getattr(getattr(self._sim, "_gateway", None), "java_process", None)
        return None if proc is None else proc.pid

    def close(self) -> None:
        if self._sim is not None:
            sim, self._sim = self._sim, None
            _stop_simulator(sim)
        self._done = True

    def __del__(self):  # best effort; `close` is the contract
        try:
            self.close()
        except Exception:
            pass

    # -- episode

    def reset(self, task: Task) -> Observation:
        spec = task.spec
        name = spec.get("task_name")
        if name is None:  # accept "name/variation" ids too
            name, _, var = task.task_id.rpartition("/")
            variation = int(var)
        else:
            variation = int(spec.get("variation", 0))
        simpl = spec.get("simplifications", self.simplifications)
        sim = self._simulator()
        try:
            sim.load(name, variation, simpl, generateGoldPath=True)
            self._gold = [str(a) for a in sim.get_gold_action_sequence()]
            if self.stock_step:  # stock: reset() = server.reset + step("look around")
                first, sinfo = sim.reset()
                first = str(first)
                self._stock_valid = [str(a) for a in sinfo["valid"]]
            else:
                first = str(sim.server.step("look around"))
            self._desc = str(sim.get_task_description())
            self._templates = [str(a) for a in sim.get_possible_actions()]
        except ValueError:
            raise
        except Exception as e:
            raise EnvError(f"ScienceWorld reset failed for {name}/{variation}: {e}") from e
        self._ag = ag_actions(self._gold, self.ag_k)
        self._guide = self.ag_guide(list(self._gold), first) if self.ag_guide is not None else None
        self._ag_windows = ag_windows(spec)
        self._task = task
        self._turn = 0
        self._last_score = 0
        self._done = False
        text = f"Task: {self._desc}\n\n{self._render(first)}"
        return Observation(text=text, privileged=self._privileged(first, score=0))

    def step(self, action_text: str) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("step() called on a finished or never-reset ScienceWorld episode")
        self._turn += 1
        parsed = parse_action(action_text, **self._parse_kw)
        info: dict[str, Any] = {"steps": self._turn, "action": parsed.action, "invalid": False,
                                "parse_error": parsed.error, "won": False, "failed": False,
                                "truncated": False}
        sim = self._sim
        if parsed.action is None:
            raw = invalid_action_message(parsed.error)
            info["invalid"] = True
            score = self._last_score
            completed = False
        else:
            try:
                if self.stock_step:
                    raw, _, completed, sinfo = sim.step(parsed.action)
                    score = int(sinfo["score"])
                    self._stock_valid = [str(a) for a in sinfo["valid"]]
                else:
                    raw = str(sim.server.step(parsed.action))
                    score = int(round(100 * float(sim.server.getScore())))
                    completed = bool(sim.server.getCompleted())
            except Exception as e:
                raise EnvError(f"ScienceWorld step failed: {e}") from e
            info["invalid"] = raw.strip() == UNKNOWN_ACTION_TEXT
        if self._guide is not None:
            self._guide.observe(parsed.action, raw)
        self._last_score = score
        won = bool(completed) and score > 0
        failed = score < 0
        done = won or failed or bool(completed)
        if not done and self._turn >= self.step_limit:
            done = info["truncated"] = True
        self._done = done
        info.update(won=won, failed=failed, score=score, completed=bool(completed))
        text = raw if done else self._render(raw)
        obs = Observation(text=text, privileged=self._privileged(raw, score))
        read = parsed.action if parsed.action is not None else str(action_text).strip()  # as written
        return StepResult(observation=obs, reward=self.reward_scale if won else 0.0, done=done,
                          info=info, action=read)

    _last_score = 0
    _stock_valid: list[str] | None = None

    # -- on-demand state

    @property
    def simulator(self):
        """The episode's simulator (the package's `ScienceWorldEnv`), for read-only getters
        (stepping it directly would bypass this env's bookkeeping)."""
        if self._sim is None:
            raise RuntimeError("no episode")
        return self._sim

    def valid_actions(self) -> list[str]:
        """All valid action/object combinations now (expensive: ~10x a raw step)."""
        if self._sim is None:
            raise RuntimeError("no episode")
        return [str(a) for a in self._sim.get_valid_action_object_combinations()]

    def goal_progress(self) -> str:
        if self._sim is None:
            raise RuntimeError("no episode")
        return str(self._sim.get_goal_progress())

    # -- rendering

    def _render(self, raw: str) -> str:
        objects = [str(o) for o in self._sim.get_possible_objects()]
        self._objects = objects
        return (f"Observation: {raw.strip()}\n\n"
                f"Action templates (OBJ is an object): {', '.join(self._templates)}\n"
                f"Objects: {', '.join(objects)}")

    _objects: list[str] = []

    def _privileged(self, raw: str, score: int) -> dict[str, Any]:
        progress = self.goal_progress()
        task = self._task
        priv: dict[str, Any] = {
            "gold_actions": list(self._gold),
            "ag_actions": list(self._ag),
            "goal_progress": progress,
            "goals": parse_goal_progress(progress),
            "score": score,
            "turn": self._turn,
            "task_name": task.spec.get("task_name", task.task_id.rpartition("/")[0]),
            "variation": task.spec.get("variation"),
            "task_description": self._desc,
            "observation": raw,
            "action_templates": list(self._templates),
            "objects": list(self._objects),
        }
        if self._guide is not None:
            wanted = self._ag_windows is None or any(a <= self._turn <= b for a, b in self._ag_windows)
            hint = self._guide.hint_at(self._sim, raw) if wanted else None
            priv["ag_hint"] = hint.action if hint else None
            priv["ag_hint_source"] = hint.source if hint else "not_requested"
        if self.stock_step and self._stock_valid is not None:
            priv["valid_actions"] = self._stock_valid
        elif self.include_valid_actions:
            priv["valid_actions"] = self.valid_actions()
        return priv
