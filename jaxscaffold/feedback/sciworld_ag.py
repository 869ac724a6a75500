"""ScienceWorld action guidance (AG) that never names an action invalid at that moment.

The gold path is fixed at reset; once the agent leaves it, its next action may be impossible
(after 3 gold steps and 'go to bathroom', 'pick up thermometer' gets "No known action
matches"). `GoldGuide` follows the episode and derives each hint from the current state:

1. the next gold action, written as the member of the simulator's current valid-action list
   that does the same thing (`resolve`: the gold path's own spellings, e.g. 'examine X',
   'drop X', 'thermometer in inventory', name the same template and objects as a listed
   action). Gold steps whose effect already holds (a door already open, an object already in
   the inventory, the room already reached) or that do nothing (answering an ambiguity
   prompt nobody asked, pouring a thing into itself) are skipped;
2. else the restore action for the agent's latest reversible deviation (going back to the
   room it came from, re-opening what it closed, ...), if that is valid now;
3. else no hint (`Hint.action` None, `Hint.source` says why; counted by the caller).
A hint the simulator refused when the agent followed it is not given again until the state
changes (the listing can, rarely, hold an action its parser then refuses).

Every hint is an action of the valid-action listing it was computed from (the listing's text,
or the same template and objects re-spelled with names only those objects have where the
listing used shared ones, which the simulator would answer with "Ambiguous request"): the
invariant holds by construction, and `tests/feedback/test_sciworld_ag.py` checks it on real
episodes with an independent simulator.

The guide runs inside the env (`ScienceWorldEnv(ag_guide=...)`, wired by
`feedback.enrichers.env_kwargs`), where the simulator lives; it reads a `SimView` (valid
actions with their templates and objects, every object's referents) and never changes state.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, NamedTuple, Sequence

# Verb spellings the gold paths use that the template list does not: gold prefix -> template prefix.
ALIASES = (("examine ", "look at "), ("drop ", "put down "), ("put ", "move "), ("go to ", "go "))
SEPARATORS = {" into ": " in ", " onto ": " on "}  # 'pour X into Y' is template 'pour OBJ in OBJ'
INVERSES = (("open ", "close "), ("close ", "open "), ("activate ", "deactivate "),
            ("deactivate ", "activate "))
_MOVED = re.compile(r"you (?:move|teleport) to the (.+?)\.", re.IGNORECASE)
_ROOM = re.compile(r"this room is called the (.+?)\.", re.IGNORECASE)
_AMBIGUOUS = "ambiguous request"
_CHOICE = re.compile(r"^\s*(\d+):", re.MULTILINE)


class Entry(NamedTuple):
    """One valid action: its text, template id and the ids of the objects in its slots."""

    action: str
    template_id: int
    obj_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SimView:
    """What the guide reads of the simulator at one moment (all read-only getters).

    `valid`: `get_valid_action_object_combinations_with_templates()`; `templates`: template
    id -> text ('use OBJ on OBJ', from `get_possible_actions_with_IDs()`); `referents`: object
    id -> every name it answers to (`get_all_object_ids_types_referents_LUTJSON()`, which
    leaves out doors, and the visible objects' current names, `get_possible_object_referent_LUT()`);
    `observation`: the simulator's last output."""

    valid: tuple[Entry, ...]
    templates: Mapping[int, str]
    referents: Mapping[int, tuple[str, ...]]
    observation: str = ""
    parent: Mapping[int, int] = dataclasses.field(default_factory=dict)  # object -> its container

    @classmethod
    def from_simulator(cls, sim, observation: str, templates: Mapping[int, str] | None = None) -> "SimView":
        valid = tuple(Entry(str(v["action"]), int(v["template_id"]), tuple(int(i) for i in v["obj_ids"]))
                      for v in sim.get_valid_action_object_combinations_with_templates())
        if templates is None:
            templates = template_table(sim)
        names: dict[int, set[str]] = {}
        for k, v in sim.get_all_object_ids_types_referents_LUTJSON().items():
            names.setdefault(int(k), set()).update(_norm(r) for r in v.get("referents", []))
        for k, name in sim.get_possible_object_referent_LUT().items():  # the visible ones'
            names.setdefault(int(k), set()).add(_norm(name))  # current names (doors: only here)
        referents = {k: tuple(sorted(v)) for k, v in names.items()}
        return cls(valid, templates, referents, str(observation), containers(sim.getObjectTree()))

    @property
    def actions(self) -> set[str]:
        return {e.action for e in self.valid}


def containers(tree: Mapping) -> dict[int, int]:
    """Object id -> the id of what contains it, from `getObjectTree()`'s nested `contents`."""
    out: dict[int, int] = {}
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in (node.get("contents") or {}).values():
            out[int(child["uuid"])] = int(node["uuid"])
            stack.append(child)
    return out


def template_table(sim) -> dict[int, str]:
    """Template id -> template text of the loaded task (constant within an episode)."""
    return {int(t["template_id"]): _norm(t["action_example"]) for t in sim.get_possible_actions_with_IDs()}


def _norm(text: str) -> str:
    return " ".join(str(text).lower().split())


def _referent_ids(name: str, index: Mapping[str, set[int]], parent: Mapping[int, int]) -> set[int]:
    """Objects a name can mean: an exact referent, or 'X in Y' / 'X on Y' (the parser's
    container qualifiers, e.g. 'thermometer in inventory', 'apple seed in flower pot 2'): the
    X inside Y (at any depth), or any X when Y names nothing known."""
    if name in index:
        return index[name]
    if name.startswith("door to "):  # doors are named "door to X", "X door" or, a room's only one, "door"
        for other in (name[len("door to "):] + " door", "door"):
            if other in index:
                return index[other]
    for sep in (" in ", " on "):
        if sep in name:
            left, right = name.rsplit(sep, 1)
            ids = _referent_ids(left, index, parent)
            where = _referent_ids(right, index, parent)
            if ids and where:
                return {o for o in ids if _inside(o, where, parent)}
            if ids:
                return ids
    return set()


def _inside(obj: int, where: set[int], parent: Mapping[int, int]) -> bool:
    seen = set()
    while obj in parent and obj not in seen:
        seen.add(obj)
        obj = parent[obj]
        if obj in where:
            return True
    return False


def _slot_splits(text: str, template: str) -> list[tuple[str, ...]]:
    """Every way `text` fills the slots ('obj') of the lower-case `template`; names may
    contain the separator ('use obj on obj': 'terminal 1 on wire on table' splits twice)."""
    parts = template.split("obj")
    if len(parts) == 1:
        return [()] if text == template else []
    prefix, rest_parts = parts[0], parts[1:]
    if not text.startswith(prefix):
        return []
    body = text[len(prefix):]
    if len(rest_parts) == 1:
        return [(body,)] if rest_parts[0] == "" and body else []
    sep, suffix = rest_parts[0], rest_parts[1]
    if len(rest_parts) > 2 or suffix:
        return []
    out, start = [], 0
    while (i := body.find(sep, start)) >= 0:
        if i > 0 and body[i + len(sep):]:
            out.append((body[:i], body[i + len(sep):]))
        start = i + 1
    return out


def resolve(action: str, view: SimView) -> str | None:
    """The valid action (a member of `view.valid`) that does what `action` says, or None.

    `action` is read as one template (after the gold paths' aliases) with object names in its
    slots; it matches a valid action with that template whose objects the names can mean."""
    text = _norm(action)
    if text in view.actions:
        return next(e.action for e in view.valid if e.action == text)
    variants = {text}
    for src, dst in ALIASES:
        if text.startswith(src):
            variants.add(dst + text[len(src):])
    for v in list(variants):
        for src, dst in SEPARATORS.items():
            variants.add(v.replace(src, dst))
    index: dict[str, set[int]] = {}
    for oid, names in view.referents.items():
        for n in names:
            index.setdefault(n, set()).add(oid)
    by_template: dict[int, list[Entry]] = {}
    for e in view.valid:
        by_template.setdefault(e.template_id, []).append(e)
    for variant in sorted(variants):
        for tid, template in view.templates.items():
            if tid not in by_template:
                continue
            for names in _slot_splits(variant, template):
                ids = [_referent_ids(n, index, view.parent) for n in names]
                if not all(ids):
                    continue
                for e in by_template[tid]:
                    if len(e.obj_ids) == len(ids) and all(o in s for o, s in zip(e.obj_ids, ids)):
                        return unambiguous(e, view)
    return None


def unambiguous(entry: Entry, view: SimView) -> str:
    """`entry`'s action, where the listing named an object by a name another object in reach
    (one the listing refers to) also has, re-spelled with a name only it has ('apple seed in
    flower pot' among three pots would make the simulator ask which one is meant). Unchanged
    when its names are unique in reach or no unique name exists."""
    reach = {o for e in view.valid for o in e.obj_ids}
    reach |= {view.parent[o] for o in reach if o in view.parent}  # and what holds them
    index: dict[str, set[int]] = {}
    for oid in reach:
        for n in view.referents.get(oid, ()):
            index.setdefault(n, set()).add(oid)
    template = view.templates.get(entry.template_id, "")
    for split in _slot_splits(entry.action, template):
        if len(split) != len(entry.obj_ids) or not all(
                oid in _referent_ids(n, index, view.parent) for n, oid in zip(split, entry.obj_ids)):
            continue
        unique = [_referent_ids(n, index, view.parent) == {oid} for n, oid in zip(split, entry.obj_ids)]
        if all(unique):
            return entry.action  # no other object in reach answers to these names
        names = [name if ok else _unique_name(name, oid, view, index)
                 for name, oid, ok in zip(split, entry.obj_ids, unique)]
        parts = template.split("obj")
        return parts[0] + "".join(n + rest for n, rest in zip(names, parts[1:]))
    return entry.action


def _unique_name(name: str, oid: int, view: SimView, index: Mapping[str, set[int]]) -> str:
    """A name of `oid` no other object has, else 'X in C' with C such a name of its container
    (the gold paths' own form, 'apple seed in flower pot 2'), else `name`."""
    own = view.referents.get(oid, ())
    for r in own:
        if index.get(r) == {oid}:
            return r
    c = view.parent.get(oid)
    base = name.split(" in ")[0].split(" on ")[0]
    for r in view.referents.get(c, ()):
        qualified = f"{base} in {r}"
        if index.get(r) == {c} and _referent_ids(qualified, index, view.parent) == {oid}:
            return qualified
    return name


class Hint(NamedTuple):
    """A hint (`action` None: none could be derived) and where it came from: "gold", "restore",
    "choice" (the answer to an ambiguity prompt: the gold path's, else the first offered) or
    "none:<why>"."""

    action: str | None
    source: str
    gold_index: int = -1  # the gold step it does (-1: not a gold step)


def _inverse(action: str) -> str | None:
    for verb, inverse in INVERSES:
        if action.startswith(verb):
            return inverse + action[len(verb):]
    return None


class GoldGuide:
    """Follows one episode against its gold path; `hint(view)` gives the next action to suggest.

    State: `k`, how many gold steps the agent has done in order (counting skipped ones);
    `restore`, a stack of actions undoing the agent's reversible off-path actions; `room`."""

    def __init__(self, gold: Sequence[str], first_observation: str = ""):
        self.gold = [_norm(a) for a in gold]
        self.k = 0
        self.restore: list[str] = []
        m = _ROOM.search(first_observation)
        self.room = _norm(m.group(1)) if m else None
        self._last: Hint | None = None
        self._templates: dict[int, str] | None = None
        # hints the simulator refused since the state last changed: not given again
        self.rejected: set[str] = set()

    def hint_at(self, sim, observation: str) -> Hint:
        """`hint` on the simulator's current state (read through its getters only)."""
        if self._templates is None:  # constant within an episode
            self._templates = template_table(sim)
        return self.hint(SimView.from_simulator(sim, observation, self._templates))

    # -- the hint

    def _achieved(self, action: str, view: SimView) -> bool:
        """Gold steps whose effect already holds or that do nothing now."""
        if action.isdigit():  # an ambiguity answer with no question pending
            return _AMBIGUOUS not in view.observation.lower()
        inverse = _inverse(action)
        if inverse is not None and resolve(inverse, view) is not None:
            return True  # e.g. 'open door' when 'close door' is valid: it is open
        if action.startswith("pick up ") and resolve("put down " + action[len("pick up "):], view):
            return True  # already in the inventory
        for prefix in ("go to ", "teleport to "):
            if action.startswith(prefix) and self.room == action[len(prefix):]:
                return True
        for verb in ("pour ", "move ", "dunk "):  # 'pour jug in jug': a thing into itself
            rest = action[len(verb):] if action.startswith(verb) else ""
            for sep in (" in ", " into ", " to "):
                a, _, b = rest.partition(sep)
                if b and a == b:
                    return True
        return False

    def hint(self, view: SimView) -> Hint:
        """The hint for the current state (always an action of `view`'s listing, or None)."""
        j = self.k
        if _AMBIGUOUS in view.observation.lower():  # the simulator waits for a number
            choices = _CHOICE.findall(view.observation)
            g = self.gold[j] if j < len(self.gold) else ""
            if g in choices:  # the gold path's own answer
                self._last = Hint(g, "choice", j)
                return self._last
            if choices:  # identical objects (seeds in one jar): any of them will do
                self._last = Hint(choices[0], "choice")
                return self._last
        while j < len(self.gold):
            g = self.gold[j]
            found = resolve(g, view)
            if found is not None and found not in self.rejected:
                self._last = Hint(found, "gold", j)
                return self._last
            if found is not None:
                break  # refused here before: a restore, or no hint
            if not self._achieved(g, view):
                break
            j += 1
        for action in reversed(self.restore):
            found = resolve(action, view)
            if found is not None and found not in self.rejected:
                self._last = Hint(found, "restore")
                return self._last
        why = "gold_done" if j >= len(self.gold) else "gold_step_invalid"
        self._last = Hint(None, f"none:{why}")
        return self._last

    # -- following the episode

    def observe(self, action: str | None, observation: str) -> None:
        """The agent did `action` (None: nothing reached the simulator) and got `observation`."""
        if action is None:
            return
        a, obs = _norm(action), observation.lower()
        if obs.startswith("no known action") or obs.startswith("unknown action"):
            self.rejected.add(a)  # changed nothing; a listed action can still be refused
            return
        self.rejected.clear()
        moved = _MOVED.search(observation)
        before = self.room
        if moved:
            self.room = _norm(moved.group(1))
        last, self._last = self._last, None
        if last is not None and last.action is not None and a == _norm(last.action):
            if last.source in ("gold", "choice"):
                self.k = max(self.k, last.gold_index + 1)
                return
            if last.source == "restore":
                self._pop(a)
                return
        if self.k < len(self.gold) and a == self.gold[self.k]:
            self.k += 1
            return
        if a in self.restore:  # it undid an earlier deviation itself
            self._pop(a)
            return
        if moved and before is not None:
            self.restore.append(f"go to {before}")
        elif (inverse := _inverse(a)) is not None and "now" in obs:  # 'The door is now open.'
            self.restore.append(inverse)

    def _pop(self, action: str) -> None:
        i = len(self.restore) - 1 - self.restore[::-1].index(action) if action in self.restore else None
        if i is None:  # the hint was a resolved spelling of a stack entry: drop the top
            if self.restore:
                self.restore.pop()
            return
        del self.restore[i]
