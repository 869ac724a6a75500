"""BFCL v3 multi-turn (base, miss_func, miss_param, long_context) as a text environment.

Data and backends come from PyPI `bfcl-eval==2025.7.17` (install with `--no-deps`, plus
`mpmath`): the entries `data/BFCL_v3_multi_turn_<category>.json`, the per-turn gold call lists
`data/possible_answer/...`, the function docs `data/multi_turn_func_doc/<module>.json` and the
backend classes in `eval_checker/multi_turn_eval/func_source_code/`. Only the backend classes
are executed, through `bfcl_calls` (ast / json parsing, dispatch to public methods of the
episode's own instances); bfcl-eval's executor (which evaluates model text) and its module-global instance
cache are never used.

Episode = one entry. Each user turn of the entry is a "turn"; inside a turn every step is one
model output: if it holds tool calls they are executed and their results are the next
observation (a "tool step"); if it holds none it is the model's text reply and ends the turn,
the observation being the next user message. More than `max_tool_steps_per_turn` (20, as
BFCL) tool steps in one turn force-quit the episode with reward 0, as BFCL does.
miss_func: the held-out functions (`missed_function`, `{turn: [names]}`) are absent from the
docs until their turn, whose (empty) user message is replaced by a notice listing them.

Deliberate differences from bfcl-eval's inference loop: an output that cannot be parsed, or
a call that is rejected (unknown / private name, non-literal argument, over a resource limit),
is answered with an "Invalid function call: ..." tool output and the turn goes on (BFCL ends the
turn on a decoding failure and `eval`s whatever decodes); a step with tool calls and text is a
tool step. A step counts as "made a call" (for the empty-turn rule below) when it holds at
least one syntactically valid named call, even if that call is then rejected (BFCL counts any
decodable call, which its `eval` then fails).

Reward (at the end): 1 iff every turn finished and every turn with a non-empty gold list
passes, as bfcl-eval's `multi_turn_checker` decides it:
- the model made at least one call in that turn (a turn whose steps made no call fails);
- state check: every public attribute (no leading `_`) of every gold instance equals the
  model's instance's after that turn; the gold instances are separate fresh instances on which
  the gold calls are replayed turn by turn (through the same ast dispatcher);
- response check: the gold results of that turn are an unordered sub-multiset of the model's
  results *of all turns so far* (BFCL's checker pools all earlier turns too; `response_scope=
  "turn"` restricts to the current turn).
Turns with an empty gold list (the miss_func / miss_param turns where the right move is to not
call) are not checked at all, exactly as in the checker (its irrelevance check is disabled);
calls made there are still executed and shape the state checked at later turns.

Observation enhancement (FEE's OE): the env exposes the hook `oe_transform`, run right after
every call on the instance it changed, for the agent's calls and the gold replay's alike; its
rules are the feedback layer's (`jaxscaffold.feedback.bfcl_oe.enrich_result`, plugged in by
`jaxscaffold.feedback.enrichers.env_kwargs`). The observation text stays the plain one and the
enriched one goes to `privileged["oe_text"]`, which the feedback layer shows on every tool result
of an episode whose group gets OE (decided per group and training step in the training
process). That decision reaches the env at reset as the task's feedback plan
(`task.spec["feedback"]` holding "oe", set by `jaxscaffold.feedback.apply.Feedback.prepare`):
the response check then compares the enriched outputs with the equally enriched gold replay's
(`response_check_with_oe`), as the reference code's env does in its OE phase.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import json
import pathlib
from typing import Any, Callable, Mapping, Sequence

from jaxscaffold.envs.base import EnvError, EnvSpec, Observation, StepResult, Task
from jaxscaffold.envs.bfcl_calls import (CallRecord, Dispatcher, ParsedCall, ResultTransform,
                                         parse_gold, parse_python_calls, parse_qwen_calls)

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
SPLITS = ("train", "validation")
# Built from the run's kwargs as its options (`BFCLEnv.from_kwargs`).
# Not audited for threads (bfcl-eval's backend classes) and CPU-bound: instances of one pool
# worker take turns (`concurrent=False`).
SPEC = EnvSpec("bfcl", __name__, "BFCLEnv", constructor="from_kwargs", splits=SPLITS, extra="envs", concurrent=False)
TRAIN_IDS, VALIDATION_IDS = range(0, 100), range(100, 200)

# class name -> module of bfcl_eval...func_source_code and its doc file stem (the same name)
CLASS_MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS_CLASSES = ("MathAPI",)  # built without `_load_scenario`, as bfcl-eval does
# Cross-domain split: an entry's *domain* is its primary classes, i.e. `involved_classes`
# intersected with these four; the auxiliary classes (TwitterAPI, MessageAPI, TicketAPI,
# MathAPI) are ignored. Train keeps entries whose domain is non-empty and within
# TRAIN_DOMAIN, validation those within VALIDATION_DOMAIN. (In v3 every entry 0-99 already
# has exactly one of GorillaFileSystem / VehicleControlAPI and every entry 100-199 exactly one
# of TradingBot / TravelAPI, so the filter keeps all 100 + 100 of each category.)
TRAIN_DOMAIN = ("GorillaFileSystem", "VehicleControlAPI")
VALIDATION_DOMAIN = ("TradingBot", "TravelAPI")

MAX_TOOL_STEPS_PER_TURN = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
# response_check_on -> the CallRecord text compared
_CHECKED_TEXT = {"transformed": "output", "raw": "raw_output", "oe": "oe_output"}

_BACKEND_PKG = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


# ------------------------------------------------------------------------------------- data

def _data_dir() -> pathlib.Path:
    try:
        import bfcl_eval
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise EnvError("BFCL needs `pip install --no-deps bfcl-eval==2025.7.17 mpmath`") from e
    return pathlib.Path(bfcl_eval.__file__).parent / "data"


def _read_jsonl(path: pathlib.Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@functools.lru_cache(maxsize=None)
def _category_data(category: str) -> tuple[tuple[dict, ...], tuple[list, ...]]:
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose from {CATEGORIES}")
    d = _data_dir()
    entries = _read_jsonl(d / f"BFCL_v3_multi_turn_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in
               _read_jsonl(d / "possible_answer" / f"BFCL_v3_multi_turn_{category}.json")}
    return tuple(entries), tuple(answers[e["id"]] for e in entries)


def load_entry(category: str, index: int) -> tuple[dict, list[list[str]]]:
    """A deep copy of entry `index` of `category` and its per-turn gold call strings."""
    entries, answers = _category_data(category)
    return copy.deepcopy(entries[index]), copy.deepcopy(answers[index])


@functools.lru_cache(maxsize=None)
def _func_docs(class_name: str) -> tuple[dict, ...]:
    return tuple(_read_jsonl(_data_dir() / "multi_turn_func_doc" /
                             f"{CLASS_MODULES[class_name]}.json"))


def func_docs(class_names: Sequence[str]) -> list[dict]:
    """BFCL's function docs of these classes, in order (deep copies)."""
    return [copy.deepcopy(d) for c in class_names for d in _func_docs(c)]


def domain(involved_classes: Sequence[str]) -> tuple[str, ...]:
    """The primary classes of an entry (see TRAIN_DOMAIN)."""
    return tuple(c for c in involved_classes if c in TRAIN_DOMAIN + VALIDATION_DOMAIN)


# Difficulty tiers (the paper stratifies its 400 validation entries by difficulty, without
# saying how): an entry's difficulty is its number of gold turns that need calls plus its number
# of gold calls (every checked turn is one more state/response check to pass, every call one more
# step to get right). The bounds split v3's validation set into thirds: easy <= 8 (136
# entries), medium 9-10 (132), hard >= 11 (132), 32-34 of each category per tier (the
# categories share their base conversations); the training set: 142 / 108 / 150.
TIERS = ("easy", "medium", "hard")
TIER_MAX_DIFFICULTY = (8, 10)  # the largest difficulty of easy and of medium


def difficulty(gold: Sequence[Sequence[str]]) -> int:
    """An entry's difficulty: its gold turns with at least one call plus its gold calls."""
    return sum(1 for turn in gold if turn) + sum(len(turn) for turn in gold)


def tier(gold: Sequence[Sequence[str]]) -> str:
    """The difficulty tier ("easy" | "medium" | "hard") of an entry's per-turn gold calls."""
    d = difficulty(gold)
    return next((t for t, bound in zip(TIERS, TIER_MAX_DIFFICULTY) if d <= bound), TIERS[-1])


def catalogue(split: str, *, categories: Sequence[str] = CATEGORIES,
              cross_domain: bool = False) -> list[Task]:
    """Tasks of `split` ("train": ids 0-99, "validation": ids 100-199 of every category); each
    task's `tags` hold its difficulty tier ("tier_easy", see `tier`)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {SPLITS}")
    ids = TRAIN_IDS if split == "train" else VALIDATION_IDS
    allowed = TRAIN_DOMAIN if split == "train" else VALIDATION_DOMAIN
    tasks = []
    for category in categories:
        entries, answers = _category_data(category)
        for i in ids:
            e = entries[i]
            dom = domain(e["involved_classes"])
            if cross_domain and not (dom and set(dom) <= set(allowed)):
                continue
            level = tier(answers[i])
            tasks.append(Task(env="bfcl", task_id=e["id"], split=split, spec={
                "category": category, "index": i, "entry_id": e["id"],
                "involved_classes": list(e["involved_classes"]), "domain": list(dom),
                "num_turns": len(e["question"]), "tier": level}, category=category, tags=(f"tier_{level}",)))
    return tasks


def make_instances(entry: Mapping, long_context: bool) -> dict[str, Any]:
    """Fresh backend instances of the entry's involved classes, loaded with `initial_config`.

    Each instance is deep-copied after `_load_scenario` so that it shares nothing with the
    backend modules' globals (long_context merges module-level dicts into the state by
    reference, e.g. TravelAPI's extra credit cards) or with other rollouts of the entry.
    """
    out = {}
    for class_name in entry["involved_classes"]:
        module = importlib.import_module(f"{_BACKEND_PKG}.{CLASS_MODULES[class_name]}")
        inst = getattr(module, class_name)()
        if class_name not in STATELESS_CLASSES:
            config = copy.deepcopy(entry["initial_config"].get(class_name, {}))
            inst._load_scenario(config, long_context=long_context)
        out[class_name] = copy.deepcopy(inst)
    return out


# ------------------------------------------------------------------------------------ prompt

def _schema(node: Any) -> Any:
    """BFCL's parameter schema as JSON Schema (dict -> object, float -> number, ...)."""
    if isinstance(node, list):
        return [_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "type" and isinstance(v, str):
            out[k] = _SCHEMA_TYPES.get(v, v)
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: _schema(p) for name, p in v.items()}
        elif k in ("items", "additionalProperties"):
            out[k] = _schema(v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def qwen_tool(doc: Mapping) -> dict:
    """One BFCL doc as a Qwen3 / OpenAI tool schema (the `response` field is dropped)."""
    params = _schema(doc.get("parameters", {"type": "dict", "properties": {}}))
    return {"type": "function", "function": {"name": doc["name"],
                                             "description": doc.get("description", ""),
                                             "parameters": params}}


_INSTRUCTIONS = (
    "You are an assistant that carries out the user's requests by calling the functions "
    "available to you. A request may take several calls; after each of your tool-calling "
    "messages you receive the results and may call more functions. Use only the functions "
    "listed and give every argument as a literal value. When the request is complete, or it "
    "cannot be completed because no suitable function exists or a required piece of "
    "information is missing, reply in plain text without any function call: summarise what "
    "was done, or say what is missing and ask the user for it. A reply without a function "
    "call ends your turn.")

_QWEN_FORMAT = (
    "\n\n# Tools\n\nThe functions you can call are described by the JSON schemas inside "
    "<tools></tools>:\n<tools>\n{tools}\n</tools>\n\nTo call a function, write a JSON object "
    "with its name and arguments inside <tool_call></tool_call> tags, one block per call:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')

_PYTHON_FORMAT = (
    "\n\nTo call functions, answer with nothing but a Python list of calls, for example "
    '[func_a(x=1), func_b(name="y")], with keyword arguments and literal values. The '
    "available functions, as JSON:\n{tools}")

_REVEAL = "Some new functions are now available to you{where}. Please continue with my request."


def _tools_block(tools: Sequence[Mapping]) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


def _resolve(obj: Any) -> Any:
    """A callable, or a "package.module:attr" import path to one (picklable for the pool)."""
    if obj is None or callable(obj):
        return obj
    if isinstance(obj, str) and ":" in obj:
        module, attr = obj.split(":", 1)
        return functools.reduce(getattr, attr.split("."), importlib.import_module(module))
    raise TypeError(f"expected a callable or a 'module:attr' path, got {obj!r}")


# --------------------------------------------------------------------------------------- env

@dataclasses.dataclass(frozen=True)
class BFCLOptions:
    """How a `BFCLEnv` formats, executes and checks an episode (the run sets them through
    `envs.env_kwargs`'s "bfcl" entry; unknown or invalid values raise at construction).

    Attributes:
      tool_format: "qwen" (`<tool_call>` JSON blocks; docs as `<tools>` schemas) or "python"
        (BFCL's `[f(a=1), g(b="x")]` call lists; docs as BFCL's JSON).
      result_transform: `(instance, method_name, kwargs, result) -> result`, or its import
        path. Applied to every executed call's result, for the agent and for the gold replay
        alike; `result` is a deep copy of the raw return value (None, dict, str, ...) or the
        raised exception; what it returns is stringified like a raw result (dict -> JSON).
        It may read the instance (e.g. `instance.pwd()`), must not change its public state,
        and should be deterministic so the gold replay is enriched the same way.
      oe_transform: the observation enhancement, a `ResultTransform` like `result_transform`
        applied on top of it, or its import path (e.g. FEE's per-class rules,
        `jaxscaffold.feedback.bfcl_oe:enrich_result`; default None: no enrichment, the
        enriched texts equal the plain ones). Every record then carries both texts: tool observations
        show the plain one, and `privileged["oe_text"]` / `privileged["tool_oe_outputs"]` hold
        the enriched one for the feedback layer to show when its schedule turns OE on. The gold
        replay is enriched by the same function, so either text compares like with like.
      response_check_on: which texts the response check compares, on both sides:
        "transformed" (default: the plain outputs the agent sees without OE, after
        `result_transform`), "raw" (BFCL's strings) or "oe" (the enriched outputs, as the
        reference code checks an episode run with OE; stricter, since e.g. the directory
        listings taken after each call must match the gold run's too).
      response_check_with_oe: the texts compared instead in an episode planned with OE
        (`task.spec["feedback"]` has "oe"): "oe" (default, the reference: enriched with
        enriched) or None (`response_check_on` always).
      response_scope: "cumulative" (BFCL: the model's results of all turns so far) or "turn".
      hidden_functions: "execute" (BFCL: held-out miss_func functions still run if called
        before their turn) or "reject" (treated as unknown until revealed).
      reveal_in: "user" (the held-out docs are written into the revealing user message) or
        "system" (only `privileged["tools"]` / the observation's `system_prompt` change; for step-wise prompts
        rebuilt from the system prompt each step).
      state_probe: `(instances) -> picklable`, or its import path; its value is put in every
        observation's `privileged["probe"]` (for feedback that needs backend state across a
        process boundary, e.g. the file system's current path).
      stop_on_failed_turn: end the episode (reward 0) as soon as a checked turn fails.
      max_tool_steps_per_turn: more tool steps than this in one turn force-quit (BFCL: 20).
      max_total_steps: optional cap on steps per episode (the reference uses 50); reaching it
        ends the episode with reward 0 (`info["truncated"]`).
      max_action_chars: longer model outputs are rejected unparsed as an invalid call.
      call_timeout_s: limit on one agent call (SIGALRM, main thread only; see bfcl_calls);
        a timed-out call returns "Error during execution: ..." like any other failure.
    """

    tool_format: str = "qwen"
    result_transform: ResultTransform | str | None = None
    oe_transform: ResultTransform | str | None = None
    response_check_on: str = "transformed"
    response_check_with_oe: str | None = "oe"
    response_scope: str = "cumulative"
    hidden_functions: str = "execute"
    reveal_in: str = "user"
    state_probe: Callable[[dict], Any] | str | None = None
    stop_on_failed_turn: bool = False
    max_tool_steps_per_turn: int = MAX_TOOL_STEPS_PER_TURN
    max_total_steps: int | None = None
    max_action_chars: int = 100_000
    call_timeout_s: float | None = 10.0

    def __post_init__(self):
        for value, allowed in ((self.tool_format, ("qwen", "python")),
                               (self.response_check_on, tuple(_CHECKED_TEXT)),
                               (self.response_check_with_oe, (*_CHECKED_TEXT, None)),
                               (self.response_scope, ("cumulative", "turn")),
                               (self.hidden_functions, ("execute", "reject")),
                               (self.reveal_in, ("user", "system"))):
            if value not in allowed:
                raise ValueError(f"{value!r} is not one of {allowed}")


class BFCLEnv:
    """BFCL v3 multi-turn episode runner (see the module docstring for the protocol), with
    `options` (`BFCLOptions`); a pool worker builds it with `from_kwargs(**env_kwargs)`."""

    name = "bfcl"

    def __init__(self, options: BFCLOptions = BFCLOptions()):
        self.options = options
        # The hooks as callables (an import path is what travels to a pool worker).
        self.result_transform = _resolve(options.result_transform)
        self.oe_transform = _resolve(options.oe_transform)
        self.state_probe = _resolve(options.state_probe)
        self._checked = options.response_check_on  # this episode's (see reset)
        self._task: Task | None = None
        self._done = True

    @classmethod
    def from_kwargs(cls, **options) -> BFCLEnv:
        """The env of `BFCLOptions(**options)`: what a pool worker calls with the run's kwargs."""
        return cls(BFCLOptions(**options))

    catalogue = staticmethod(catalogue)

    # ------------------------------------------------------------------ episode lifecycle
    def reset(self, task: Task) -> Observation:
        spec = dict(task.spec)
        category = spec.get("category") or _category_of(task.task_id)
        index = int(spec["index"]) if "index" in spec else int(task.task_id.rsplit("_", 1)[1])
        entry, gold = load_entry(category, index)
        if entry["id"] != spec.get("entry_id", entry["id"]):
            raise EnvError(f"task {task.task_id} does not match entry {entry['id']}")
        self._task, self._entry, self._gold, self._category = task, entry, gold, category
        oe_planned = "oe" in (spec.get("feedback") or {})
        o = self.options
        self._checked = o.response_check_with_oe if oe_planned and o.response_check_with_oe else o.response_check_on
        long_context = "long_context" in category
        self._instances = make_instances(entry, long_context)
        self._gold_instances = make_instances(entry, long_context)
        # {turn: [names]} of held-out functions, revealed at that turn (miss_func only)
        self._missed = {int(k): list(v) for k, v in entry.get("missed_function", {}).items()}
        self._hidden = {n for names in self._missed.values() for n in names}
        self._docs = [d for d in func_docs(entry["involved_classes"])
                      if d["name"] not in self._hidden]
        # one pair of transforms for both sides: the gold results are enriched like the agent's
        self._agent = Dispatcher(self._instances, result_transform=self.result_transform,
                                 oe_transform=self.oe_transform, blocked=self._blocked,
                                 call_timeout_s=self.options.call_timeout_s)
        self._gold_runner = Dispatcher(self._gold_instances,
                                       result_transform=self.result_transform,
                                       oe_transform=self.oe_transform)
        # Turns = user turns. v3 has one entry whose gold has more turns than its questions
        # (multi_turn_base_154: 5 vs 6); BFCL marks it force-terminated (always failed), and
        # so does this env: it plays the 5 turns and then scores 0 ("gold_turn_mismatch").
        self._n_turns = len(entry["question"])
        n = max(self._n_turns, len(gold))
        self._turn = 0
        self._done = False
        self._steps = 0
        self._steps_in_turn = 0
        self._tool_steps_in_turn = 0
        self._records: list[list[CallRecord]] = [[] for _ in range(n)]
        self._gold_records: list[list[CallRecord]] = [[] for _ in range(n)]
        self._called: list[bool] = [False] * n  # the turn had a step with a (named) call
        self._replies: list[str | None] = [None] * n
        self._checks: list[dict] = []
        return self._turn_observation(first=True)

    def step(self, action_text: str) -> StepResult:
        if self._done:
            raise EnvError("step() called on a finished episode; call reset() first")
        self._steps += 1
        self._steps_in_turn += 1
        calls = self._parse(action_text)
        if calls is None:  # a plain reply: the turn ends
            return self._end_turn(action_text)
        records = [self._agent.execute(c) for c in calls]
        t = self._turn
        self._records[t].extend(records)
        if any(c.name != "?" for c in calls):
            self._called[t] = True
        self._tool_steps_in_turn += 1
        invalid = any(r.invalid for r in records)
        info = {"invalid": invalid, "steps": self._steps, "turn": t, "turn_ended": False,
                "tool_step": True}
        obs = Observation(self._tool_text(records), self._privileged(records, role="tool"))
        if self._tool_steps_in_turn > self.options.max_tool_steps_per_turn:
            return self._finish(obs, info, failure="force_quit",
                                message=f"more than {self.options.max_tool_steps_per_turn} tool steps "
                                        f"in turn {t}")
        if self.options.max_total_steps is not None and self._steps >= self.options.max_total_steps:
            return self._finish(obs, info, failure="truncated",
                                message=f"reached {self.options.max_total_steps} steps")
        return StepResult(obs, 0.0, False, info)

    def close(self) -> None:
        self._task = None
        self._done = True
        self._instances = self._gold_instances = {}

    # ------------------------------------------------------------------ read access
    @property
    def instances(self) -> dict[str, Any]:
        """The agent's live backend instances (read them; changing them changes the episode)."""
        return self._instances

    @property
    def gold_instances(self) -> dict[str, Any]:
        """The gold replay's instances (replayed up to the last finished turn)."""
        return self._gold_instances

    @property
    def tools(self) -> list[dict]:
        """The currently available functions as Qwen3 / OpenAI tool schemas."""
        return [qwen_tool(d) for d in self._docs]

    @property
    def func_docs(self) -> list[dict]:
        """The currently available functions as BFCL docs."""
        return copy.deepcopy(self._docs)

    def system_prompt(self, with_tools: bool = True) -> str:
        """The system message. `with_tools=False`: the instructions only, for a chat renderer
        given `tools=self.tools` (Qwen3's template then writes the `<tools>` block itself)."""
        if not with_tools:
            return _INSTRUCTIONS
        if self.options.tool_format == "qwen":
            return _INSTRUCTIONS + _QWEN_FORMAT.format(tools=_tools_block(self.tools))
        return _INSTRUCTIONS + _PYTHON_FORMAT.format(tools=json.dumps(self._docs,
                                                                      ensure_ascii=False))

    # ------------------------------------------------------------------ internals
    def _blocked(self, name: str) -> str | None:
        if self.options.hidden_functions == "reject" and name in self._hidden:
            if not any(name in self._missed[k] for k in self._missed if k <= self._turn):
                return (f"unknown function '{name}'; only the listed functions can be called")
        return None

    def _parse(self, text: str) -> list[ParsedCall] | None:
        if not isinstance(text, str):
            return [ParsedCall("?", error=f"the action must be text, got {type(text).__name__}")]
        if len(text) > self.options.max_action_chars:
            return [ParsedCall("?", error=f"the output is too long ({len(text)} characters; "
                                          f"limit {self.options.max_action_chars}); it was not parsed")]
        try:
            if self.options.tool_format == "qwen":
                return parse_qwen_calls(text)
            return parse_python_calls(text)
        except RecursionError:
            return [ParsedCall("?", error="the output is nested too deeply to parse")]

    def _tool_text(self, records: Sequence[CallRecord], oe: bool = False) -> str:
        outputs = [r.oe_output if oe else r.output for r in records]
        if self.options.tool_format == "qwen":
            return "\n".join(outputs)
        return "\n".join(f"{r.name}: {out}" for r, out in zip(records, outputs))

    def _turn_observation(self, first: bool = False) -> Observation:
        t = self._turn
        messages = self._entry["question"][t]
        revealed = self._missed.get(t, [])
        if revealed:
            new = [d for d in func_docs(self._entry["involved_classes"]) if d["name"] in revealed]
            self._docs.extend(new)
            text = self._reveal_text(new)
            if messages:  # never in v3 (the revealing turn has no user message), but keep it
                text = "\n\n".join([m["content"] for m in messages] + [text])
        else:
            text = "\n\n".join(m["content"] for m in messages)
        with_prompt = first or bool(revealed)
        priv = self._privileged([], role="user", revealed=revealed, with_prompt=with_prompt)
        return Observation(text, priv, system_prompt=self.system_prompt() if with_prompt else None)

    def _reveal_text(self, new_docs: list[dict]) -> str:
        if self.options.reveal_in == "system":
            return _REVEAL.format(where="")
        if self.options.tool_format == "qwen":
            block = _tools_block([qwen_tool(d) for d in new_docs])
            return _REVEAL.format(where=" (schemas below)") + f"\n<tools>\n{block}\n</tools>"
        return _REVEAL.format(where=" (listed below)") + "\n" + json.dumps(new_docs,
                                                                          ensure_ascii=False)

    def _privileged(self, records: Sequence[CallRecord], *, role: str,
                    revealed: Sequence[str] = (), with_prompt: bool = False) -> dict:
        t, n = self._turn, self._n_turns
        p = {
            "entry_id": self._entry["id"], "category": self._category,
            "involved_classes": list(self._entry["involved_classes"]),
            "turn": t, "num_turns": n, "step_in_turn": self._steps_in_turn,
            "message_role": role,  # "user": a new user turn; "tool": results of tool calls
            "gold_calls": list(self._gold_turn(t)) if t < n else [],
            "gold_calls_all": [list(g) for g in self._gold],
            "missed_function": {k: list(v) for k, v in self._missed.items()},
            "revealed_functions": list(revealed),
            "tool_results": [r.as_dict() for r in records],
            "tool_outputs": [r.output for r in records],
            "tool_oe_outputs": [r.oe_output for r in records],
            "turn_checks": [dict(c) for c in self._checks],
        }
        if role == "tool":  # the whole observation text with OE, for the feedback layer
            p["oe_text"] = self._tool_text(records, oe=True)
        if with_prompt:
            p["instructions"] = self.system_prompt(with_tools=False)
            p["tools"] = self.tools
        if self.state_probe is not None:
            p["probe"] = self.state_probe(self._instances)
        return p

    def _end_turn(self, reply: str) -> StepResult:
        t = self._turn
        self._replies[t] = reply
        try:
            gold_calls = parse_gold(self._gold_turn(t))
        except ValueError as e:
            raise EnvError(str(e)) from e
        self._gold_records[t] = [self._gold_runner.execute(c) for c in gold_calls]
        bad = [r for r in self._gold_records[t] if r.invalid]
        if bad:
            raise EnvError(f"{self._entry['id']} turn {t}: gold call rejected: {bad[0].output}")
        check = self._check_turn(t)
        self._checks.append(check)
        info = {"invalid": False, "steps": self._steps, "turn": t, "turn_ended": True,
                "tool_step": False, "turn_check": dict(check)}
        self._turn += 1
        self._steps_in_turn = self._tool_steps_in_turn = 0
        last = self._turn >= self._n_turns
        if last or (self.options.stop_on_failed_turn and not check["valid"]):
            obs = Observation("", self._privileged([], role="user"))
            return self._finish(obs, info)
        obs = self._turn_observation()
        if self.options.max_total_steps is not None and self._steps >= self.options.max_total_steps:
            return self._finish(obs, info, failure="truncated",
                                message=f"reached {self.options.max_total_steps} steps")
        return StepResult(obs, 0.0, False, info)

    def _finish(self, obs: Observation, info: dict, failure: str | None = None,
                message: str = "") -> StepResult:
        self._done = True
        failed = [c for c in self._checks if not c["valid"]]
        if failure is None and not failed and self._n_turns != len(self._gold):
            failure, message = "gold_turn_mismatch", (
                f"the entry has {self._n_turns} user turns but {len(self._gold)} gold turns "
                "(bfcl-eval scores it as force-terminated)")
        won = failure is None and len(self._checks) == len(self._gold) and not failed
        info = dict(info, won=won, score=float(won), turn_checks=[dict(c) for c in self._checks],
                    turns_finished=len(self._checks))
        if failure is not None:
            info.update({failure: True, "failure": failure, "failure_message": message})
        elif failed:
            info.update({"failure": failed[0]["error_type"],
                         "failure_message": failed[0]["error_message"]})
        elif not won:
            info.update({"failure": "unfinished", "failure_message": "not all turns finished"})
        obs.privileged["turn_checks"] = [dict(c) for c in self._checks]
        return StepResult(obs, 1.0 if won else 0.0, True, info)

    def _gold_turn(self, t: int) -> list[str]:
        return self._gold[t] if t < len(self._gold) else []

    def _check_turn(self, t: int) -> dict:
        base = {"turn": t, "valid": True, "checked": bool(self._gold_turn(t))}
        if not self._gold_turn(t):
            return base  # the checker skips turns with an empty gold list
        if not self._called[t]:
            return dict(base, valid=False, error_type="multi_turn:empty_turn_model_response",
                        error_message=f"no function call in turn {t}")
        for class_name, gold_inst in self._gold_instances.items():
            model_inst = self._instances[class_name]
            diffs = sorted(a for a in vars(gold_inst) if not a.startswith("_")
                           and getattr(model_inst, a, _MISSING) != getattr(gold_inst, a))
            if diffs:
                return dict(base, valid=False, error_type="multi_turn:instance_state_mismatch",
                            error_message=f"{class_name} differs from the gold state in "
                                          f"{diffs} after turn {t}",
                            details={"class": class_name, "attributes": diffs})
        key = _CHECKED_TEXT[self._checked]
        turns = range(t + 1) if self.options.response_scope == "cumulative" else [t]
        pool = [getattr(r, key) for k in turns for r in self._records[k]]
        missing = []
        for g in (getattr(r, key) for r in self._gold_records[t]):
            try:
                pool.remove(g)
            except ValueError:
                missing.append(g)
        if missing:
            return dict(base, valid=False, error_type="multi_turn:execution_response_mismatch",
                        error_message=f"{len(missing)} gold result(s) of turn {t} missing from "
                                      "the model's results",
                        details={"missing": missing})
        return base


_MISSING = object()


def _category_of(task_id: str) -> str:
    stem = task_id.rsplit("_", 1)[0]
    for c in CATEGORIES:
        if stem == f"multi_turn_{c}":
            return c
    raise EnvError(f"cannot tell the BFCL category of task {task_id!r}")
