"""Safe parsing and dispatch of BFCL tool calls (no `eval`, no `exec`).

Model text is untrusted. It is parsed with `ast` (BFCL's Python call-list format,
`[f(a=1), g("x")]`) or `json` (Qwen3's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks) into `ParsedCall`s: a plain function name plus literal arguments (constants, lists,
tuples, sets, dicts, signed numbers). Nothing else survives parsing: attribute access,
subscripts, nested calls, names, operators, comprehensions, lambdas, `*`/`**` unpacking are
rejected with an error text. A `Dispatcher` then maps a name to a *public* bound method of one
of the episode's backend instances (the same name resolution as BFCL's executor: later classes
in `involved_classes` win a clash, which never happens in v3) and calls it with those values.

Results are stringified exactly as BFCL's executor does (so the response check compares the
same strings): `str` unchanged, `dict` via `json.dumps` (falling back to `str`), anything else
`str(...)`, and a raised exception becomes `"Error during execution: <message>"`.

Every executed call carries three texts: `raw_output` (BFCL's string of the raw result),
`output` (after the optional `result_transform`: what the agent sees by default) and
`oe_output` (`output` with the optional `oe_transform` applied on top: the
observation-enhanced text, shown only when the feedback layer turns OE on). Both hooks run
right after the call on the same instance, so the agent's and the gold replay's records are
enriched by the same function from the same kind of state.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import decimal
import inspect
import json
import re
import signal
import sys
import threading
from typing import Any, Callable, Mapping, Sequence

from jaxscaffold.envs.actions import strip_reasoning

# (instance, method_name, kwargs_view, result) -> result; `result` is the raw return value
# (a deep copy, so in-place edits cannot reach the backend state) or the raised exception.
ResultTransform = Callable[[Any, str, dict, Any], Any]

_FENCE = re.compile(r"^```[A-Za-z0-9_+-]*\s*\n?(.*?)\n?```$", re.S)
_LOOKS_LIKE_CALL = re.compile(r"^\s*\[?\s*[A-Za-z_][\w.]*\s*\(")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclasses.dataclass
class ParsedCall:
    """One attempted call. `error` set means it is rejected and must not be executed."""

    name: str
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    error: str | None = None

    def render(self, max_chars: int = 2000) -> str:
        """The call as BFCL-style Python text (for logs, hints, the feedback layer)."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        text = f"{self.name}({', '.join(parts)})"
        return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


@dataclasses.dataclass
class CallRecord:
    """A call as executed (or rejected): what the agent / the gold replay sees and checks."""

    name: str
    args: tuple
    kwargs: dict
    class_name: str | None  # None when rejected
    ok: bool  # False: rejected (invalid) or the method raised
    invalid: bool  # True: rejected before execution (never ran)
    raw_output: str  # BFCL-stringified raw result (what BFCL's checker compares)
    output: str  # stringified result after `result_transform` (what the agent sees)
    result: Any = None  # the raw Python result (None for rejected / raised calls)
    oe_output: str | None = None  # `output` enriched by `oe_transform` (None: same as output)

    def __post_init__(self):
        if self.oe_output is None:
            self.oe_output = self.output

    def as_dict(self) -> dict:
        return {"method": self.name, "class": self.class_name, "args": list(self.args),
                "kwargs": dict(self.kwargs), "ok": self.ok, "invalid": self.invalid,
                "raw_output": self.raw_output, "output": self.output,
                "oe_output": self.oe_output, "result": self.result}


# ---------------------------------------------------------------------------------- literals

_SCALARS = (str, int, float, bool, type(None))


class _NotLiteral(ValueError):
    pass


def literal_value(node: ast.AST, depth: int = 0) -> Any:
    """The value of a literal-only expression node; raises `_NotLiteral` otherwise."""
    if depth > 64:
        raise _NotLiteral("argument nested too deeply")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, _SCALARS):
            return node.value
        raise _NotLiteral(f"unsupported constant type {type(node.value).__name__}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = node.operand
        if (isinstance(operand, ast.Constant) and isinstance(operand.value, (int, float))
                and not isinstance(operand.value, bool)):
            return -operand.value if isinstance(node.op, ast.USub) else operand.value
        raise _NotLiteral("a sign is only allowed before a number")
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                raise _NotLiteral("'*' unpacking is not allowed")
            items.append(literal_value(elt, depth + 1))
        if isinstance(node, ast.List):
            return items
        if isinstance(node, ast.Tuple):
            return tuple(items)
        try:
            return set(items)
        except TypeError as e:
            raise _NotLiteral(f"invalid set literal: {e}") from None
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise _NotLiteral("'**' unpacking is not allowed")
            key = literal_value(k, depth + 1)
            try:
                out[key] = literal_value(v, depth + 1)
            except TypeError as e:
                raise _NotLiteral(f"invalid dict key: {e}") from None
        return out
    kind = type(node).__name__
    if isinstance(node, ast.Call):
        raise _NotLiteral("nested function calls are not allowed as arguments")
    if isinstance(node, ast.Name):
        raise _NotLiteral(f"variable names are not allowed as arguments (got '{node.id}')")
    if isinstance(node, ast.Attribute):
        raise _NotLiteral("attribute access is not allowed")
    raise _NotLiteral(f"only literal arguments are allowed (got a {kind} expression)")


def _call_from_node(node: ast.AST) -> ParsedCall:
    if not isinstance(node, ast.Call):
        return ParsedCall("?", error=f"expected a function call, got a {type(node).__name__} "
                                     "expression")
    func = node.func
    if not isinstance(func, ast.Name):
        if isinstance(func, ast.Attribute):
            return ParsedCall("?", error="only plain function names can be called "
                                         "(attribute access such as 'a.b(...)' is not allowed)")
        return ParsedCall("?", error="only plain function names can be called "
                                     f"(got a {type(func).__name__} expression)")
    call = ParsedCall(func.id)
    try:
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise _NotLiteral("'*' unpacking is not allowed")
            args.append(literal_value(a))
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise _NotLiteral("'**' unpacking is not allowed")
            if kw.arg in kwargs:
                raise _NotLiteral(f"duplicate argument '{kw.arg}'")
            kwargs[kw.arg] = literal_value(kw.value)
    except _NotLiteral as e:
        call.error = f"invalid arguments for '{func.id}': {e}"
        return call
    except RecursionError:
        call.error = f"invalid arguments for '{func.id}': nested too deeply"
        return call
    call.args, call.kwargs = tuple(args), kwargs
    return call


def _contains_call(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(tree))


def parse_python_calls(text: str) -> list[ParsedCall] | None:
    """Parse BFCL's Python call-list format. None: the text is not a call attempt (a reply).

    A call attempt is text that parses as a Python expression containing a call, a statement
    block containing a call, or text that starts like a call (`name(` / `[name(`). A reply is
    anything else ("Done.", prose). Attempts that are not a list of plain literal calls give
    `ParsedCall`s with `error` set.
    """
    text = strip_reasoning(text).strip()
    m = _FENCE.match(text)
    if m:
        text = m.group(1).strip()
    if not text:
        return None
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        try:
            block = ast.parse(text, mode="exec")
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            block = None
        if block is not None and _contains_call(block):
            return [ParsedCall("?", error="expected a list of function calls such as "
                                          "[func(a=1)], got Python statements")]
        if _LOOKS_LIKE_CALL.match(text):
            msg = e.msg if isinstance(e, SyntaxError) else type(e).__name__
            return [ParsedCall("?", error=f"could not parse the function call list ({msg})")]
        return None
    except Exception:  # noqa: BLE001 - any parser failure is just "not parsable"
        return [ParsedCall("?", error="could not parse the function call list")]
    body = tree.body
    try:
        has_call = _contains_call(body)
    except RecursionError:
        return [ParsedCall("?", error="expression nested too deeply")]
    if not has_call:
        return None
    if isinstance(body, (ast.List, ast.Tuple)):
        return [_call_from_node(elt) for elt in body.elts] or None
    return [_call_from_node(body)]


def parse_qwen_calls(text: str) -> list[ParsedCall] | None:
    """Parse Qwen3 `<tool_call>` JSON blocks. None: no tool-call tag at all (a reply)."""
    text = strip_reasoning(text)
    if "<tool_call>" not in text and "</tool_call>" not in text:
        return None
    blocks = _TOOL_CALL.findall(text)
    opened, closed = text.count("<tool_call>"), text.count("</tool_call>")
    calls: list[ParsedCall] = []
    if opened != closed or opened != len(blocks) or any("<tool_call>" in b for b in blocks):
        calls.append(ParsedCall("?", error="malformed <tool_call> tags (each call must be one "
                                           "<tool_call>...</tool_call> block, not nested)"))
        blocks = [b for b in blocks if "<tool_call>" not in b]
    for block in blocks:
        calls.append(_qwen_block(block))
    return calls


def _qwen_block(block: str) -> ParsedCall:
    try:
        obj = json.loads(block)
    except (ValueError, RecursionError) as e:
        return ParsedCall("?", error=f"the <tool_call> content is not valid JSON ({e})"[:300])
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParsedCall("?", error='a <tool_call> must hold {"name": <function-name>, '
                                     '"arguments": {...}}')
    name = obj["name"]
    if not name.isidentifier():
        return ParsedCall("?", error=f"invalid function name {name[:80]!r}")
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return ParsedCall(name, error=f"the arguments of '{name}' are not a JSON object")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ParsedCall(name, error=f"the arguments of '{name}' must be a JSON object")
    bad = [k for k in args if not (isinstance(k, str) and k.isidentifier())]
    if bad:
        return ParsedCall(name, error=f"invalid argument name {str(bad[0])[:80]!r} for '{name}'")
    return ParsedCall(name, kwargs=dict(args))


# ---------------------------------------------------------------------------------- dispatch

def stringify(result: Any) -> str:
    """BFCL's executor conversion of a return value to the compared string."""
    if isinstance(result, BaseException):
        return f"Error during execution: {result}"
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except Exception:  # noqa: BLE001 - BFCL falls back to str on any dumps failure
            return str(result)
    return str(result)


def public_methods(instances: Mapping[str, Any]) -> dict[str, tuple[str, Callable]]:
    """name -> (class_name, bound method) over public methods, later classes winning a clash."""
    table: dict[str, tuple[str, Callable]] = {}
    for class_name, inst in instances.items():
        for name, method in inspect.getmembers(inst, predicate=inspect.ismethod):
            if not name.startswith("_"):
                table[name] = (class_name, method)
    return table


class Dispatcher:
    """Executes `ParsedCall`s on one set of backend instances, only via public methods.

    `result_transform` gives `output` from the raw result; `oe_transform` gives `oe_output`
    from what `result_transform` returned (or from the raw result). Both get a deep copy of
    the result (or the raised exception) and the live instance, which they may read but must
    not change. An `oe_transform` that raises leaves `oe_output` equal to `output`.
    """

    def __init__(self, instances: Mapping[str, Any], *,
                 result_transform: ResultTransform | None = None,
                 oe_transform: ResultTransform | None = None,
                 blocked: Callable[[str], str | None] | None = None,
                 call_timeout_s: float | None = None):
        self.instances = dict(instances)
        self.table = public_methods(self.instances)
        self.result_transform = result_transform
        self.oe_transform = oe_transform
        self.blocked = blocked  # name -> reason it may not be called now, or None
        self.call_timeout_s = call_timeout_s

    def _reject(self, call: ParsedCall, message: str) -> CallRecord:
        text = f"Invalid function call: {message}. Nothing was executed."
        return CallRecord(call.name, call.args, call.kwargs, None, False, True, text, text)

    def execute(self, call: ParsedCall) -> CallRecord:
        if call.error is not None:
            return self._reject(call, call.error)
        name = call.name
        if name.startswith("_"):
            return self._reject(call, f"'{name[:80]}' is private; only the listed functions "
                                      "can be called")
        if name not in self.table:
            return self._reject(call, f"unknown function '{name[:80]}'; only the listed "
                                      "functions can be called")
        private = [k for k in call.kwargs if k.startswith("_")]
        if private:
            return self._reject(call, f"argument names may not start with '_' "
                                      f"(got '{private[0][:80]}')")
        if self.blocked is not None:
            reason = self.blocked(name)
            if reason:
                return self._reject(call, reason)
        class_name, method = self.table[name]
        too_big = _over_limit(class_name, name, _kwargs_view(method, call))
        if too_big:
            return self._reject(call, too_big)
        try:  # as BFCL: the stringification is inside the try too (huge ints raise there)
            with _time_limit(self.call_timeout_s), _process_globals_restored():
                result = method(*call.args, **call.kwargs)
                raw_output = stringify(result)
        except Exception as e:  # noqa: BLE001 - BFCL returns the error text to the model
            result = e
            raw_output = stringify(e)
        ok = not isinstance(result, BaseException)
        output = oe_output = raw_output
        if self.result_transform is None and self.oe_transform is None:
            return CallRecord(name, call.args, call.kwargs, class_name, ok, False, raw_output,
                              output, copy.deepcopy(result) if ok else None)
        instance, kwargs = self.instances[class_name], _kwargs_view(method, call)
        view = copy.deepcopy(result) if ok else result  # in-place edits cannot reach the state
        if self.result_transform is not None:
            view = self.result_transform(instance, name, kwargs, view)
            output = oe_output = _stringify_or(view, raw_output)
        if self.oe_transform is not None:
            try:
                oe_output = _stringify_or(self.oe_transform(instance, name, kwargs, view), output)
            except Exception:  # noqa: BLE001 - a failing enrichment must not end the episode
                oe_output = output
        return CallRecord(name, call.args, call.kwargs, class_name, ok, False, raw_output,
                          output, copy.deepcopy(result) if ok else None, oe_output)


def _stringify_or(value: Any, fallback: str) -> str:
    try:
        return stringify(value)
    except Exception:  # noqa: BLE001 - an unprintable enrichment: keep the plain text
        return fallback


# Arguments that make one backend call run for minutes inside C code (uninterruptible):
# Decimal.sqrt at precision 1e6 takes ~10 s here, 1e8 hangs; 10 ** (10 ** 9) never ends.
# The gold answers stay far below these (precision at most 10; no gold power call).
RESOURCE_LIMITS = {
    ("MathAPI", "square_root"): {"precision": 10_000},
    ("MathAPI", "logarithm"): {"precision": 10_000},
    ("MathAPI", "power"): {"exponent": 10_000, "base": 10 ** 100},
}


def _over_limit(class_name: str, method: str, kwargs: Mapping[str, Any]) -> str | None:
    for arg, limit in RESOURCE_LIMITS.get((class_name, method), {}).items():
        value = kwargs.get(arg)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and abs(value) > limit:
            return f"argument '{arg}' of '{method}' is too large (limit {limit:g})"
    return None


@contextlib.contextmanager
def _process_globals_restored():
    """Undo what backend calls do to process-wide state: MathAPI.square_root sets the decimal
    context's precision and MathAPI.logarithm sets mpmath's, for every later user."""
    mp = sys.modules.get("mpmath")
    prec = mp.mp.prec if mp is not None else None
    try:
        with decimal.localcontext():
            yield
    finally:
        if mp is not None and prec is not None:
            mp.mp.prec = prec


class CallTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """SIGALRM-based limit on one backend call (main thread only; a no-op elsewhere). It stops
    Python-level work (e.g. mpmath at an absurd precision); one long C-level operation (a
    giant integer power) only notices it when that operation returns."""
    if (not seconds or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return

    def on_alarm(signum, frame):
        raise CallTimeout(f"the call took longer than {seconds:g} s and was stopped")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _kwargs_view(method: Callable, call: ParsedCall) -> dict:
    """The call's arguments by parameter name (positional ones bound to their names)."""
    if not call.args:
        return dict(call.kwargs)
    try:
        bound = inspect.signature(method).bind_partial(*call.args, **call.kwargs)
        return dict(bound.arguments)
    except (TypeError, ValueError):
        view = {f"arg{i}": a for i, a in enumerate(call.args)}
        view.update(call.kwargs)
        return view


def parse_gold(calls: Sequence[str]) -> list[ParsedCall]:
    """Parse a turn's gold call strings (trusted dataset text, still through `ast`)."""
    out = []
    for s in calls:
        parsed = parse_python_calls(s)
        if not parsed or len(parsed) != 1 or parsed[0].error:
            raise ValueError(f"unparsable gold call {s!r}: {parsed}")
        out.extend(parsed)
    return out
