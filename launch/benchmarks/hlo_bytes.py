"""Bytes accessed by an HLO module, op by op, from its text: XLA's own cost-analysis rules
(xla/service/hlo_cost_analysis.cc), re-applied so that some of them can be changed.

XLA's rules, per instruction: its output plus every operand, in full; except parameters,
constants, get-tuple-element and bitcasts (nothing), a tuple (its pointer table), a slice or
dynamic slice (twice what it produces: read, then written as a copy), a dynamic-update-slice
(twice the update, in place), a gather (twice its output), a scatter (three times its
updates, in place), a call (its computation), a while loop (its body and condition ONCE,
whatever the trip count). `bytes_accessed(text)` with the defaults reproduces
`jax.stages.Lowered.cost_analysis()["bytes accessed"]` of an unoptimised module to within
0.1-0.5% (the decode bench prints the check, its test asserts it): XLA takes one transpose of
the decode step for a bitcast that the rule here (only size-1 axes move) counts.

The changes:
- `loops=True`: a loop whose trip count the text states (`lax.scan` / `fori_loop`: the
  condition is `counter < constant`, counting from 0) counts its body that many times; other
  loops (a sampler's decode loop) once.
- `fused=True`: slices, dynamic slices and reshapes count nothing of their own; their
  consumers read the sliced bytes where they lie (as TPU / GPU fusion reads a layer's weights
  or a cache window, and as XLA's cost analysis counts a slice inside a fusion). Every other
  op stays unfused: intermediates are written and read once per op that touches them.
- `fusion=True`: a model of XLA's loop and input fusion on top: calls are inlined; an
  elementwise op (broadcast, convert, select, compare included) or view all of whose users are
  elementwise ops, views or reduces is fused into them and moves nothing; every other op (a
  fusion's root: a dot, a reduce, an elementwise op feeding a dot, a scatter, ...) writes its
  output and reads, once each, the arrays its fused producers read. A fused producer shared
  by two roots is recomputed by each (its inputs read twice); nothing is fused into a dot.
- `skip_scope="name"`: the ops traced under `jax.named_call(name=...)` count nothing (the
  text must carry their names: `as_text(dialect="hlo", debug_info=True)`), for a part that
  another kernel runs and the caller counts itself (the paged cache's read: the TPU kernel).
What none of them model: a compiler's own choices beyond these (multi-output fusion, a dot
fused with its softmax, a copy for a layout change on TPU's tiled layouts, a slice it does not
fuse). The figures are a model of a fusing compile, not a compile: only one on the device
(or a run) shows those.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_POINTER = 8  # bytes per element of a tuple's pointer table (XLA's kDefaultPointerSize)
_FREE = {"parameter", "constant", "get-tuple-element", "bitcast", "after-all", "add-dependency", "domain"}
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


@dataclasses.dataclass
class Instruction:
    name: str
    shape: str  # the HLO type text: an array `f32[2,3]{1,0}` or a tuple `(s32[], ...)`
    opcode: str
    operands: list[str]
    args: str  # the text between the opcode's parentheses (a constant's literal)
    attrs: str
    root: bool = False


def _matching(text: str, start: int) -> int:
    """Index just past the bracket group opening at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced HLO text near {text[start:start + 80]!r}")


def _split_top(text: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def parse(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """Computations (name -> instructions) of an HLO module's text, and the entry's name."""
    comps: dict[str, list[Instruction]] = {}
    entry, current = None, None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("HloModule", "//")):
            continue
        if stripped == "}":
            current = None
            continue
        if current is None and stripped.endswith("{"):
            head = stripped[:-1].strip()
            is_entry = head.startswith("ENTRY ")
            name = head.removeprefix("ENTRY ").split(" ")[0].split("(")[0].lstrip("%")
            comps[name], current = [], name
            entry = name if is_entry else entry
            continue
        if current is None:
            continue
        body = stripped.removeprefix("ROOT ")
        root = stripped.startswith("ROOT ")
        name, rest = body.split(" = ", 1)
        if rest.startswith("("):
            end = _matching(rest, 0)
            shape, rest = rest[:end], rest[end:].strip()
        else:
            shape, rest = rest.split(" ", 1)
        opcode = rest[: rest.index("(")]
        close = _matching(rest, len(opcode))
        args = rest[len(opcode) + 1: close - 1]
        operands = [] if opcode == "constant" else [a.split(" ")[-1].lstrip("%") for a in _split_top(args)]
        comps[current].append(Instruction(name.lstrip("%"), shape, opcode, operands, args, rest[close:], root))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO array type, or of a tuple's pointer table (as XLA sizes a tuple)."""
    if shape.startswith("("):
        return _POINTER * len(_split_top(shape[1:-1]))
    m = _ARRAY.match(shape)
    if m is None or m.group(1) not in _DTYPE_BYTES:
        return 0  # token and opaque types
    dims = [int(d) for d in m.group(2).split(",") if d]
    return math.prod(dims) * _DTYPE_BYTES[m.group(1)]


def attr(inst: Instruction, key: str) -> str | None:
    """The value of attribute `key` of `inst` (a computation's name, for `body=` or `to_apply=`)."""
    m = re.search(rf"\b{key}=%?([\w.\-]+)", inst.attrs)
    return None if m is None else m.group(1)


def _is_bitcast_transpose(inst: Instruction) -> bool:
    """A transpose that moves only size-1 axes (XLA counts it as a bitcast)."""
    m = re.search(r"dimensions=\{([\d,]*)\}", inst.attrs)
    out = _ARRAY.match(inst.shape)
    if m is None or out is None:
        return False
    perm = [int(d) for d in m.group(1).split(",") if d]
    dims = [int(d) for d in out.group(2).split(",") if d]
    moved = [p for p, d in zip(perm, dims) if d != 1]
    return moved == sorted(moved)


def trip_count(comps, condition: str) -> int | None:
    """N of a loop whose condition is `counter < N` for a constant N (jax's scan / fori_loop)."""
    insts = {i.name: i for i in comps[condition]}
    root = comps[condition][-1]
    if root.opcode != "compare" or "direction=LT" not in root.attrs or len(root.operands) != 2:
        return None
    bound = insts.get(root.operands[1])
    if bound is None or bound.opcode != "constant" or not bound.shape.startswith(("s32[]", "s64[]", "u32[]")):
        return None
    return int(bound.args) if re.fullmatch(r"-?\d+", bound.args.strip()) else None


@dataclasses.dataclass
class Counted:
    total: float = 0.0
    by_opcode: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add(self, opcode: str, n: float) -> None:
        self.total += n
        self.by_opcode[opcode] += n


# XLA's loop fusion: elementwise ops (broadcasts, converts and selects among them) fuse into an
# elementwise or reduce consumer; views are read where they lie.
_ELEMENTWISE = {
    "abs", "add", "and", "atan2", "broadcast", "cbrt", "ceil", "clamp", "compare", "convert", "cosine", "divide",
    "erf", "exponential", "exponential-minus-one", "floor", "iota", "is-finite", "log", "log-plus-one", "logistic",
    "maximum", "minimum", "multiply", "negate", "not", "or", "popcnt", "power", "remainder", "round-nearest-afz",
    "round-nearest-even", "rsqrt", "select", "shift-left", "shift-right-arithmetic", "shift-right-logical", "sign",
    "sine", "sqrt", "subtract", "tan", "tanh", "xor", "bitcast-convert"}
_VIEWS = {"slice", "dynamic-slice", "reshape", "bitcast"}


def _inline(comps, name: str, prefix: str = "", args: list[str] | None = None) -> tuple[list[Instruction], str]:
    """A computation's instructions with its calls inlined (as XLA's call inliner does before
    fusion), parameters of an inlined call renamed to the caller's operands; and its root."""
    alias, out, root = {}, [], None
    for inst in comps[name]:
        if inst.opcode == "parameter" and args is not None:
            alias[inst.name] = args[int(inst.args)]
            if inst.root:
                root = alias[inst.name]
            continue
        operands = [alias.get(o, o) for o in inst.operands]
        if inst.opcode == "call":
            body, alias[inst.name] = _inline(comps, attr(inst, "to_apply"), f"{prefix}{inst.name}/", operands)
            out += body
        else:
            alias[inst.name] = f"{prefix}{inst.name}"
            # An inlined computation's root is an ordinary value of the caller.
            out.append(dataclasses.replace(inst, name=alias[inst.name], operands=operands,
                                           root=inst.root and args is None))
        if inst.root:
            root = alias[inst.name]
    return out, root


class UnsupportedHlo(ValueError):
    """An op whose bytes XLA's rules leave undefined here (a conditional, a custom call):
    the count refuses the module rather than guess."""


def _indexed_bytes(inst: Instruction, size) -> int | None:
    """XLA's rules for the ops that read or write through indices (a tuple: its pointers),
    where they differ from "operands + output"; None for every other op."""
    op = inst.opcode
    if op == "tuple":
        return shape_bytes(inst.shape)
    if op == "dynamic-update-slice":  # in place: the update read and written, the indices read
        return 2 * size(inst.operands[1]) + size(inst.operands[2])
    if op == "gather":
        return 2 * shape_bytes(inst.shape) + size(inst.operands[1])
    if op == "scatter":
        k = (len(inst.operands) - 1) // 2
        return 3 * sum(size(u) for u in inst.operands[k + 1:]) + size(inst.operands[k])
    return None


_OP_NAME = re.compile(r'op_name="([^"]*)"')


def in_scope(inst: Instruction, scope: str | None) -> bool:
    """Whether `inst` was traced under the named scope `scope` (its metadata's op_name)."""
    if scope is None:
        return False
    m = _OP_NAME.search(inst.attrs)
    return m is not None and scope in m.group(1).split("/")[:-1]


def _fused_bytes(insts: list[Instruction], counted: Counted, times: float, visit_loop,
                 skip_scope: str | None = None) -> None:
    """Bytes of a call-free instruction list under loop fusion: an elementwise op or view all of
    whose users are elementwise ops, views or reduces writes nothing; every other op (a
    fusion's root) writes its output and reads, once each, the arrays its fused producers
    read (a view of an unfused array: the viewed bytes, in place)."""
    by_name = {i.name: i for i in insts}
    users = collections.defaultdict(list)
    for inst in insts:
        for o in inst.operands:
            users[o].append(inst)
    fusible = _ELEMENTWISE | _VIEWS

    def fuses(inst):  # every user takes it into its own fusion
        return not inst.root and users[inst.name] and all(u.opcode in fusible | {"reduce"} for u in users[inst.name])

    absorbed = {i.name for i in insts if i.opcode in _ELEMENTWISE and fuses(i)}
    # A view of fused values is one of them; a view of an array in memory reads it in place.
    of_values = set()
    for inst in insts:
        if inst.opcode in _VIEWS and (inst.operands[0] in absorbed or inst.operands[0] in of_values):
            of_values.add(inst.name)
            if fuses(inst):
                absorbed.add(inst.name)

    def leaves(name: str, seen: set, acc: dict) -> None:
        if name in seen:
            return
        seen.add(name)
        inst = by_name.get(name)
        if inst is None or inst.opcode == "constant":
            return
        if name in absorbed:
            for o in inst.operands[:1] if inst.opcode in _VIEWS else inst.operands:  # a view's indices: scalars
                leaves(o, seen, acc)
        else:
            acc[name] = shape_bytes(inst.shape)

    for inst in insts:
        op = inst.opcode
        if inst.name in absorbed or op in _FREE or (op == "transpose" and _is_bitcast_transpose(inst)):
            continue
        if in_scope(inst, skip_scope):
            continue
        if op in _VIEWS and inst.name not in of_values:
            continue  # read in place by its consumers
        if op == "while":
            visit_loop(inst, times)
            continue
        size = lambda name: shape_bytes(by_name[name].shape) if name in by_name else 0  # noqa: E731
        n = _indexed_bytes(inst, size)
        if n is None:
            acc: dict = {}
            seen: set = set()
            for o in inst.operands:
                leaves(o, seen, acc)
            n = shape_bytes(inst.shape) + sum(acc.values())
        counted.add(op, n * times)


def bytes_accessed(text: str, *, loops: bool = False, fused: bool = False, fusion: bool = False,
                   skip_scope: str | None = None) -> Counted:
    """Bytes accessed by the module `text` (an HLO module, as `Lowered.as_text("hlo")`), by
    XLA's cost-analysis rules, with the changes the module docstring describes: `loops`,
    `fused` (views free), `fusion` (loop fusion of elementwise ops, views free too) and
    `skip_scope` (a named scope's ops count nothing)."""
    comps, entry = parse(text)
    counted = Counted()

    def visit_loop(inst: Instruction, times: float) -> None:
        trips = trip_count(comps, attr(inst, "condition")) if loops else None
        n = 1 if trips is None else trips
        visit(attr(inst, "body"), times * n)
        visit(attr(inst, "condition"), times * n)

    def visit(comp: str, times: float) -> None:
        if fusion:
            return _fused_bytes(_inline(comps, comp)[0], counted, times, visit_loop, skip_scope)
        insts = comps[comp]
        shapes = {i.name: i.shape for i in insts}
        size = lambda name: shape_bytes(shapes.get(name, ""))  # noqa: E731
        for inst in insts:
            op = inst.opcode
            if op in _FREE or (op == "transpose" and _is_bitcast_transpose(inst)) or in_scope(inst, skip_scope):
                continue
            if op == "call":
                visit(attr(inst, "to_apply"), times)
                continue
            if op == "while":
                visit_loop(inst, times)
                continue
            if op == "conditional":
                raise UnsupportedHlo("conditional: XLA takes the costliest branch per property")
            if op == "custom-call":
                raise UnsupportedHlo(f"custom-call {inst.name}: XLA counts it as unknown (-1)")
            n = _indexed_bytes(inst, size)
            if n is None and op in _VIEWS and fused:
                n = 0  # views, read in place by their consumers
            elif n is None and op in ("slice", "dynamic-slice"):
                index = size(inst.operands[1]) if op == "dynamic-slice" else 0
                n = 2 * shape_bytes(inst.shape) + index
            elif n is None:
                n = shape_bytes(inst.shape) + sum(size(o) for o in inst.operands)
            counted.add(op, n * times)

    visit(entry, 1.0)
    return counted
