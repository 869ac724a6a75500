"""ALFWorld (text) adapter: household tasks played through TextWorld's PDDL engine.

The engine comes from PyPI (`alfworld`, `textworld`, `fast-downward-textworld`) and runs fully
offline; the game files do not (see `catalogue`). Each game is loaded through `textworld.gym`
with ALFWorld's own `AlfredDemangler` (readable, numbered object names such as "apple 2") and
`AlfredInfos` wrappers, as ALFWorld's `AlfredTWEnv` does, so observations and admissible
commands are the official ones.

Data layout (what `python -m jaxscaffold.envs.alfworld_data unpack ARCHIVE` writes under
`$ALFWORLD_DATA`, as ALFWorld's own download does)::

    <data_dir>/json_2.1.1/<split>/<task-folder>/<trial>/game.tw-pddl

with splits `train` (3553 games), `valid_seen` (140, in-distribution evaluation) and
`valid_unseen` (134, out-of-distribution). The task folder reads
`<task_type>-<Object>-<MovableRecep>-<ParentRecep>-<scene>`.

Episode semantics:
  * `reset(task)` gives ALFWorld's standard first observation: the room description followed by
    "Your task is to: ..." (TextWorld's "-= Welcome to TextWorld, ALFRED! =-" banner is dropped,
    as the usual ALFWorld prompts do; `keep_banner=True` keeps it).
  * `step(text)` cleans the model text (content of the last `<action>...</action>` if any,
    `<think>` blocks dropped, NFKC, lower case, whitespace collapsed, stray quotes / a trailing
    period removed). A command that is not among the current admissible commands does not change
    the game: the observation is ALFWorld's "Nothing happens." and `info["invalid"] = True`
    (it is not sent to the engine, which would answer the same; nothing is ever evaluated).
  * reward = `reward_scale` (default 1.0) on the step that wins (`won` is terminal), else 0.
  * the episode ends when won or after `step_limit` steps (default 50; every call to `step`
    counts, invalid ones too); `info["truncated"]` tells the second case.

Privileged information (`Observation.privileged`, for the feedback layer only):
  * `admissible_commands` (alias `valid_actions`): the engine's admissible commands, sorted.
  * `walkthrough` (alias `gold_actions`): the expert plan stored in the game file.
  * `next_walkthrough_action`: the next walkthrough command while the agent's state-changing
    commands so far equal a prefix of the walkthrough (look / inventory / examine / help and
    invalid commands are neutral); None once the agent has left the plan or finished it.
    `on_walkthrough` says which. `ALFWorldEnv.expert_plan()` replans from the current state
    with the engine's planner (about 1 s) when the agent has left the walkthrough.
  * `goal_progress`: ordered sub-goals for the task type, each `{"name", "done"}`, computed from
    the engine's current facts; a sub-goal counts as done if it holds now or a later one does
    (e.g. "pick up the apple" is done once the apple is in the fridge). `subgoals_done` counts
    the done ones, `subgoals_total` the total.
  * `task_type`, `task_params` (object / receptacle types), `gamefile`, `steps`, `won`.
"""

from __future__ import annotations

import functools
import os
import re
import unicodedata
from pathlib import Path
from typing import Any, Iterable

from jaxscaffold.envs import alfworld_data
from jaxscaffold.envs.actions import action_of
from jaxscaffold.envs.base import EnvError, EnvSpec, Observation, StepResult, Task

NAME = "alfworld"
SPLITS = alfworld_data.SPLITS
DEFAULT_DATA_DIR = alfworld_data.DEFAULT_DATA_DIR  # ALFWorld's own default (alfworld.info), without importing it
SPLIT_ALIASES = {
    "eval_in_distribution": "valid_seen",
    "eval_out_of_distribution": "valid_unseen",
    "in_distribution": "valid_seen",
    "out_of_distribution": "valid_unseen",
}
# Not audited for threads (TextWorld / fast-downward; ALFWorld's import sets $ALFWORLD_DATA) and
# CPU-bound: instances of one pool worker take turns (`concurrent=False`).
SPEC = EnvSpec(NAME, __name__, "ALFWorldEnv", splits=(*SPLITS, *SPLIT_ALIASES), extra="envs", concurrent=False)
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
DATA_SUBDIR = alfworld_data.DATA_SUBDIR
GAME_FILE = alfworld_data.GAME_FILE
NOTHING_HAPPENS = "Nothing happens."
EPISODE_OVER = "The episode is over."
MAX_ACTION_CHARS = 300  # longer cleaned text cannot be an ALFWorld command
_LAYOUT = f"<data_dir>/{DATA_SUBDIR}/<split>/<task-folder>/<trial>/{GAME_FILE}"
_INSTALL_HINT = (
    "ALFWorld's engine is missing: pip install --no-deps alfworld textworld jericho "
    "fast-downward-textworld, plus tatsu==5.8.3 hashids mementos more_itertools termcolor "
    "prompt_toolkit (see the jaxscaffold set-up notes)."
)


# --------------------------------------------------------------------------------------------
# Data and catalogue
# --------------------------------------------------------------------------------------------


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The `json_2.1.1` folder from `data_dir` (its parent, or the folder itself), else
    `$ALFWORLD_DATA`, else ALFWorld's own default (`~/.cache/alfworld`); a `FileNotFoundError`
    saying which variable to set and which command unpacks the files otherwise."""
    source, root = alfworld_data.data_dir(data_dir)
    for candidate in (root / DATA_SUBDIR, root):
        if any((candidate / s).is_dir() for s in SPLITS):
            return candidate
    raise FileNotFoundError(
        f"ALFWorld game files not found under {source} {str(root)!r}: expected {_LAYOUT}. Get "
        f"{alfworld_data.ARCHIVE_SOURCE}, run `{alfworld_data.UNPACK_COMMAND}` (it unpacks into "
        "$ALFWORLD_DATA, default ~/.cache/alfworld) and set $ALFWORLD_DATA to that folder.")


def parse_task_folder(folder: str) -> dict[str, Any]:
    """`pick_heat_then_place_in_recep-Apple-None-Fridge-10` -> task type and its parameters."""
    parts = folder.split("-")
    task_type = parts[0]
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type in folder name {folder!r}")
    params: dict[str, Any] = {"task_type": task_type}
    if len(parts) >= 5:
        params.update(
            object=parts[1],
            mrecep=None if parts[2] == "None" else parts[2],
            parent=parts[3],
            scene=parts[4],
        )
    return params


def _normalise_split(split: str) -> str:
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; expected one of {SPLITS}")
    return split


def tasks_from_relpaths(split: str, relpaths: Iterable[str]) -> list[Task]:
    """Tasks from game-file paths relative to `json_2.1.1` (`<split>/<folder>/<trial>/game.tw-pddl`).

    Shared by `catalogue` (a folder listing) and anything that lists a tarball instead. Like
    ALFWorld's `AlfredTWEnv`, "movable" and "Sliced" task folders are skipped (none in 2.1.1).
    """
    split = _normalise_split(split)
    tasks = []
    for rel in relpaths:
        parts = rel.strip("/").split("/")
        if len(parts) != 4 or parts[0] != split or parts[3] != GAME_FILE:
            continue
        _, folder, trial, _ = parts
        if "movable" in folder or "Sliced" in folder:
            continue
        try:
            params = parse_task_folder(folder)
        except ValueError:
            continue
        tasks.append(
            Task(
                env=NAME,
                task_id=f"{folder}/{trial}",
                split=split,
                spec={"gamefile": "/".join(parts), **params},
                category=params["task_type"],
            )
        )
    tasks.sort(key=lambda t: t.task_id)
    return tasks


def catalogue(split: str, data_dir: str | os.PathLike | None = None) -> list[Task]:
    """All games of a split (`train`, `valid_seen` = in-distribution, `valid_unseen` =
    out-of-distribution), sorted by task id. Only lists folders; game files are read at reset.

    `Task.spec` holds `gamefile` (relative to `json_2.1.1`, so tasks travel between machines),
    `task_type`, `object`, `mrecep`, `parent`, `scene`.
    """
    split = _normalise_split(split)
    root = resolve_data_dir(data_dir)
    split_dir = root / split
    if not split_dir.is_dir():
        raise FileNotFoundError(f"ALFWorld split folder missing: {split_dir} (expected {_LAYOUT})")
    rels = []
    with os.scandir(split_dir) as folders:
        for folder in folders:
            if not folder.is_dir():
                continue
            with os.scandir(folder.path) as trials:
                for trial in trials:
                    if trial.is_dir() and os.path.isfile(os.path.join(trial.path, GAME_FILE)):
                        rels.append(f"{split}/{folder.name}/{trial.name}/{GAME_FILE}")
    return tasks_from_relpaths(split, rels)


# --------------------------------------------------------------------------------------------
# Action text
# --------------------------------------------------------------------------------------------

_THINK_RE = re.compile(r"<think>.*?(?:</think>|$)", re.IGNORECASE | re.DOTALL)
_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_OPEN_ACTION_RE = re.compile(r"<action>", re.IGNORECASE)
_ANY_TAG_RE = re.compile(r"</?\s*[a-z_]+\s*/?>", re.IGNORECASE)
_WS_RE = re.compile(r"\s+")
_STRIP_CHARS = " \t\r\n\"'`*>"


def clean_action(text: Any) -> str:
    """Model text -> an ALFWorld-style command string (may be empty). Pure string handling."""
    if not isinstance(text, str):
        return ""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ch for ch in text if ch.isprintable() or ch.isspace())
    matches = _ACTION_RE.findall(text)
    if matches:
        text = matches[-1]
    else:
        text = _THINK_RE.sub(" ", text)
        opened = list(_OPEN_ACTION_RE.finditer(text))
        if opened:  # an <action> without its closing tag: take what follows it
            text = text[opened[-1].end():]
    text = _ANY_TAG_RE.sub(" ", text)
    text = _WS_RE.sub(" ", text).strip(_STRIP_CHARS).lower()
    text = text.rstrip(".!").strip(_STRIP_CHARS)
    return text


def _is_neutral(command: str) -> bool:
    """Commands that never change the world state (so they do not leave the walkthrough)."""
    return command == "look" or command == "inventory" or command == "help" or command.startswith(
        "examine "
    )


# --------------------------------------------------------------------------------------------
# Sub-goals from the engine's facts
# --------------------------------------------------------------------------------------------

_STATE_PREDICATE = {
    "pick_clean_then_place_in_recep": ("isclean", "clean"),
    "pick_heat_then_place_in_recep": ("ishot", "heat"),
    "pick_cool_then_place_in_recep": ("iscool", "cool"),
}


def _goal_progress(task_type: str, params: dict[str, Any], facts: list) -> list[dict[str, Any]]:
    """Ordered sub-goals evaluated on the demangled facts (Propositions) of the current state."""
    obj = str(params.get("object", "")).lower()
    parent = str(params.get("parent", "")).lower()
    obj_t, parent_t = obj + "type", parent + "type"
    otype: dict[str, str] = {}
    rtype: dict[str, str] = {}
    held: set[str] = set()
    inside: list[tuple[str, str]] = []
    unary: dict[str, set[str]] = {}
    for fact in facts:
        name = fact.name.lower()
        args = [a.name.strip() for a in fact.arguments]  # demangled names end in " "
        if name == "objecttype" and len(args) == 2:
            otype[args[0]] = args[1].lower()
        elif name == "receptacletype" and len(args) == 2:
            rtype[args[0]] = args[1].lower()
        elif name == "holds" and len(args) == 2:
            held.add(args[1])
        elif name == "inreceptacle" and len(args) == 2:
            inside.append((args[0], args[1]))
        elif len(args) == 1:
            unary.setdefault(name, set()).add(args[0])

    def is_obj(o: str) -> bool:
        return otype.get(o) == obj_t

    holding = any(is_obj(o) for o in held)
    placed = [o for o, r in inside if is_obj(o) and rtype.get(r) == parent_t]
    names: list[str]
    now: list[bool]
    if task_type == "pick_and_place_simple":
        names = [f"pick up a {obj}", f"put a {obj} in/on a {parent}"]
        now = [holding, bool(placed)]
    elif task_type in _STATE_PREDICATE:
        pred, verb = _STATE_PREDICATE[task_type]
        treated = unary.get(pred, set())
        names = [f"pick up a {obj}", f"{verb} the {obj}", f"put the {verb}ed {obj} in/on a {parent}"]
        now = [
            holding,
            any(is_obj(o) and o in treated for o in set(otype)),
            any(o in treated for o in placed),
        ]
    elif task_type == "pick_two_obj_and_place":
        n_placed = len(set(placed))
        names = [f"put a first {obj} in/on a {parent}", f"put a second {obj} in/on a {parent}"]
        now = [n_placed >= 1, n_placed >= 2]
    elif task_type == "look_at_obj_in_light":
        lamp_t = parent_t
        toggled = unary.get("istoggled", set()) | unary.get("ison", set())
        names = [f"pick up a {obj}", f"turn on a {parent} while holding the {obj}"]
        lamp_on = any(otype.get(o) == lamp_t for o in toggled)
        now = [holding, holding and lamp_on]
    else:
        return []
    done = list(now)
    for i in range(len(done) - 2, -1, -1):
        done[i] = done[i] or done[i + 1]
    return [{"name": n, "done": d} for n, d in zip(names, done)]


# --------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------


def _import_engine():
    """Import textworld's gym and ALFWorld's wrappers without letting `import alfworld` leave
    `$ALFWORLD_DATA` pointing at its default cache (it sets the variable as a side effect)."""
    saved = os.environ.get("ALFWORLD_DATA")
    try:
        import textworld
        import textworld.gym  # noqa: F401  (registers the gym envs)
        from textworld.envs.pddl import PddlEnv
        from textworld.gym.envs import TextworldGymEnv
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        import fast_downward
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise EnvError(f"{_INSTALL_HINT} ({e})") from e
    finally:
        if saved is None:
            os.environ.pop("ALFWORLD_DATA", None)
        else:
            os.environ["ALFWORLD_DATA"] = saved
    _translate_each_game_once(fast_downward)
    return textworld, TextworldGymEnv, PddlEnv, AlfredDemangler, AlfredInfos


def _translate_each_game_once(fast_downward) -> None:
    """Memoise fast-downward's PDDL -> SAS translation in this process.

    TextWorld's `PddlState` translates the game's PDDL twice (plain and optimised) each time it
    is built, and `PddlEnv` builds one on load and another on every reset: about 80% of a reset
    (0.4-2 s a game here), repeated for every rollout of a group. The translation is a pure
    function of the domain and problem texts, and TextWorld only reads the task it returns, so
    each game is translated once. Bounded: the 16 most recent translations (two a game, about
    1 MB each; a group's rollouts reset the same game one after another).
    """
    if not hasattr(fast_downward.pddl2sas, "cache_info"):
        fast_downward.pddl2sas = functools.lru_cache(maxsize=16)(fast_downward.pddl2sas)


class ALFWorldEnv:
    """One ALFWorld text game at a time (`Env` protocol). Not thread-safe; one per process."""

    name = NAME
    POOL_METHODS = ("expert_plan",)  # what `EnvPool` may call by name

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        step_limit: int = 50,
        reward_scale: float = 1.0,
        keep_banner: bool = False,
        goal_progress: bool = True,
    ) -> None:
        if step_limit < 1:
            raise ValueError("step_limit must be >= 1")
        self._data_dir_arg = data_dir
        self._root: Path | None = None
        self.step_limit = int(step_limit)
        self.reward_scale = float(reward_scale)
        self.keep_banner = keep_banner
        self.track_goal_progress = goal_progress
        self._gym = None
        self._loaded: str | None = None  # the game file currently loaded in the engine
        self._task: Task | None = None
        self._infos: dict[str, Any] = {}
        self._steps = 0
        self._done = True
        self._won = False
        self._walkthrough: list[str] = []
        self._wt_pos = 0
        self._on_walkthrough = True
        self._last_text = ""
        self._params: dict[str, Any] = {}

    # -- helpers -------------------------------------------------------------------------

    def _gamefile(self, task: Task) -> Path:
        if task.env != NAME:
            raise ValueError(f"task for env {task.env!r} given to {NAME}")
        rel = task.spec.get("gamefile")
        if not rel:
            raise ValueError("ALFWorld task spec lacks 'gamefile'")
        if os.path.isabs(rel):
            path = Path(rel)
        else:
            if self._root is None:
                self._root = resolve_data_dir(self._data_dir_arg)
            path = self._root / rel
        if not path.is_file():
            raise FileNotFoundError(f"ALFWorld game file missing: {path} (expected {_LAYOUT})")
        return path

    def _make_gym(self, gamefile: str):
        textworld, TextworldGymEnv, PddlEnv, AlfredDemangler, AlfredInfos = _import_engine()
        self._PddlEnv = PddlEnv
        request = textworld.EnvInfos(
            won=True, admissible_commands=True, facts=self.track_goal_progress,
            extras=["gamefile", "walkthrough"],
        )
        # No textworld step Limit: this adapter counts steps itself (invalid ones included).
        return TextworldGymEnv(
            [gamefile], request, max_episode_steps=None,
            wrappers=[AlfredDemangler(shuffle=False), AlfredInfos],
        )

    def _find_pddl(self):
        """The PddlEnv under the wrappers (for `expert_plan`); None if the layout changed."""
        try:
            env = self._gym.batch_env.envs[0]
            for _ in range(16):
                if isinstance(env, self._PddlEnv):
                    return env
                env = env.__dict__.get("_wrapped_env")
                if env is None:
                    return None
        except Exception:
            return None
        return None

    def _text(self, raw: str) -> str:
        raw = raw.strip()
        if not self.keep_banner and raw.startswith("-="):
            head, sep, rest = raw.partition("\n\n")
            if sep and "Welcome to TextWorld" in head:
                raw = rest.strip()
        return raw

    def _privileged(self) -> dict[str, Any]:
        adm = list(self._infos.get("admissible_commands") or [])
        nxt = None
        if self._on_walkthrough and self._wt_pos < len(self._walkthrough):
            nxt = self._walkthrough[self._wt_pos]
        priv: dict[str, Any] = {
            "admissible_commands": adm,
            "valid_actions": adm,
            "walkthrough": list(self._walkthrough),
            "gold_actions": list(self._walkthrough),
            "next_walkthrough_action": nxt,
            "on_walkthrough": self._on_walkthrough,
            "task_type": self._params.get("task_type"),
            "task_params": dict(self._params),
            "gamefile": self._infos.get("extra.gamefile"),
            "steps": self._steps,
            "won": self._won,
        }
        if self.track_goal_progress and "facts" in self._infos:
            progress = _goal_progress(
                self._params.get("task_type", ""), self._params, self._infos["facts"] or []
            )
            if self._won and progress:  # the engine's goal check is the ground truth
                progress = [{**g, "done": True} for g in progress]
            priv["goal_progress"] = progress
            priv["subgoals_done"] = sum(g["done"] for g in progress)
            priv["subgoals_total"] = len(progress)
        return priv

    # -- Env protocol ----------------------------------------------------------------------

    def reset(self, task: Task) -> Observation:
        path = str(self._gamefile(task))
        try:
            if self._gym is None:
                self._gym = self._make_gym(path)
            if path == self._loaded and self._gym.batch_env is not None:
                # Same game again (e.g. the rollouts of a GRPO group): the engine rebuilds the
                # whole game state on reset, so skip re-parsing the game file (half the cost).
                obs_b, infos_b = self._gym.batch_env.reset()
                obs, infos = obs_b[0], {k: v[0] for k, v in infos_b.items()}
            else:
                self._loaded = None
                self._gym.gamefiles = [path]
                self._gym.seed(task.seed)  # only orders the (single-game) pool
                obs, infos = self._gym.reset()
                self._loaded = path
        except EnvError:
            raise
        except Exception as e:
            self._loaded = None
            raise EnvError(f"ALFWorld failed to load {path}: {e!r}") from e
        self._task = task
        self._infos = infos
        self._params = parse_task_folder(Path(path).parent.parent.name)
        self._steps = 0
        self._done = False
        self._won = bool(infos.get("won", False))
        self._walkthrough = list(infos.get("extra.walkthrough") or [])
        self._wt_pos = 0
        self._on_walkthrough = True
        self._last_text = self._text(obs)
        return Observation(text=self._last_text, privileged=self._privileged())

    def step(self, action_text: str) -> StepResult:
        if self._task is None:
            raise EnvError("ALFWorldEnv.step called before reset")
        command = clean_action(action_text)
        if self._done:
            info = {"invalid": True, "won": self._won, "steps": self._steps,
                    "episode_over": True, "command": command[:MAX_ACTION_CHARS]}
            return StepResult(Observation(EPISODE_OVER, self._privileged()), 0.0, True, info,
                              action=action_of(action_text))
        self._steps += 1
        admissible = self._infos.get("admissible_commands") or []
        invalid = len(command) > MAX_ACTION_CHARS or command not in admissible
        if invalid:
            text = NOTHING_HAPPENS  # what the engine answers to any non-admissible command
        else:
            try:
                obs, _score, _done, infos = self._gym.step(command)
            except Exception as e:
                raise EnvError(f"ALFWorld engine failed on {command!r}: {e!r}") from e
            self._infos = infos
            text = self._text(obs)
            if self._on_walkthrough and not _is_neutral(command):
                if self._wt_pos < len(self._walkthrough) and command == self._walkthrough[self._wt_pos]:
                    self._wt_pos += 1
                else:
                    self._on_walkthrough = False
        won = bool(self._infos.get("won", False))
        reward = self.reward_scale if (won and not self._won) else 0.0
        self._won = won
        truncated = not won and self._steps >= self.step_limit
        self._done = won or truncated
        self._last_text = text
        info = {
            "invalid": invalid,
            "won": won,
            "score": 1.0 if won else 0.0,
            "steps": self._steps,
            "truncated": truncated,
            "command": command[:MAX_ACTION_CHARS],
            "task_type": self._params.get("task_type"),
        }
        return StepResult(Observation(text, self._privileged()), reward, self._done, info,
                          action=action_of(action_text))

    def expert_plan(self) -> list[str] | None:
        """Replan from the current state with the engine's planner (~1 s); None if unavailable."""
        if self._gym is None or self._task is None:
            return None
        pddl = self._find_pddl()
        if pddl is None:
            return None
        try:
            return list(pddl._pddl_state.replan(pddl._entity_infos))
        except Exception:
            return None

    def close(self) -> None:
        if self._gym is not None:
            try:
                self._gym.close()
            except Exception:
                pass
        self._gym = None
        self._loaded = None
        self._task = None
        self._done = True


__all__ = [
    "ALFWorldEnv",
    "NAME",
    "SPLITS",
    "TASK_TYPES",
    "catalogue",
    "clean_action",
    "parse_task_folder",
    "resolve_data_dir",
    "tasks_from_relpaths",
]
