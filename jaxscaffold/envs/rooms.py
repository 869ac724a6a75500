"""Rooms: a procedurally generated house where FEE's effects can be seen on a CPU.

A seeded generator lays out 3-5 coloured rooms joined by doors (a random tree), some doors
locked (a key of the room's colour opens them, lying somewhere reachable, maybe in a closed
container), and a goal: put an item, itself maybe in a closed container behind a locked door,
into a container of a given room. Every task's shortest solution is 6-12 actions; success (1.0)
only when the goal holds: sparse and long-horizon, like ScienceWorld, but with a vocabulary of
a few dozen words, so a tiny model can learn it in minutes when feedback guides it.

An exact planner (breadth-first search over the world's states) gives, at every step, the
first action of a shortest plan from the current state (`next_walkthrough_action`: AG is
always a valid action) and a true sub-goal checklist (`goals`: keys found, doors unlocked,
item found, goal done), read only by feedback and the scripted policies. Splits: "train" and
"test" have disjoint layouts (a test world equal to a train world is skipped).

Actions (one per turn, the text itself or inside <action>...</action>): `go to <colour>`,
`open <container>`, `take <item>`, `unlock <colour> door`, `put <item> in <container>`, `look`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import random
from typing import Iterator

from jaxscaffold.envs.actions import parse_action
from jaxscaffold.envs.base import EnvSpec, Observation, StepResult, Task

NAME = "rooms"
SPLITS = ("train", "test")
# The CPU testbed for FEE (its words make the `rooms` vocabulary).
SPEC = EnvSpec(NAME, __name__, "RoomsEnv", splits=SPLITS, vocabulary="vocabulary_texts")
SPLIT_SIZES = {"train": 512, "test": 64}
COLOURS = ("red", "blue", "green", "yellow", "white")
CONTAINERS = ("box", "drawer", "chest", "basket")
ITEMS = ("gem", "coin", "book", "ball")
MIN_PLAN, MAX_PLAN = 6, 12
_SPLIT_SEEDS = {"train": 0, "test": 10_000_000}  # disjoint seed ranges, and layouts checked
# Every fixed text the env writes (describe, step, checklist, the action forms): with the names
# above, its whole vocabulary (a word-level tokenizer for the testbed is built from it).
TEMPLATE_TEXTS = (
    "Goal: put the item in the container of the room room.", "You are in the room.",
    "A door leads to the room (locked).", "The container is open; in it: the thing, nothing.",
    "The container is closed.", "On the floor: the thing.", "You carry: nothing.",
    "Actions: go to; open; take; unlock door; put in; look", "key",
    "Nothing happens.", "Done: the goal holds.", "find the key", "unlock the door",
)


def vocabulary_texts() -> tuple[str, ...]:
    """Texts holding every word the env writes (for a word-level tokenizer)."""
    return TEMPLATE_TEXTS + COLOURS + CONTAINERS + ITEMS


@dataclasses.dataclass(frozen=True)
class World:
    """A task's fixed layout; the mutable part is a `State`."""

    rooms: tuple[str, ...]
    doors: frozenset  # frozenset({a, b}) pairs of adjacent rooms
    locked: frozenset  # rooms whose doors start locked (from every side)
    containers: tuple  # (room, container) pairs, all start closed
    start: str
    placements: tuple  # (thing, location): location a room or a (room, container); things: items, "<c> key"
    goal: tuple  # (item, (room, container))

    def neighbours(self, room: str) -> list[str]:
        return sorted(b for d in self.doors if room in d for b in d if b != room)


@dataclasses.dataclass(frozen=True)
class State:
    room: str
    held: frozenset
    opened: frozenset  # (room, container) opened
    unlocked: frozenset  # rooms unlocked
    where: tuple  # (thing, location) for things not held, sorted

    def location(self, thing: str):
        return dict(self.where).get(thing)


def initial_state(w: World) -> State:
    return State(w.start, frozenset(), frozenset(), frozenset(), tuple(sorted(w.placements, key=repr)))


def goal_done(w: World, s: State) -> bool:
    item, place = w.goal
    return s.location(item) == place


def _visible(w: World, s: State) -> list[str]:
    """Things the agent can take: on the floor of its room or in an open container there."""
    return sorted(t for t, loc in s.where
                  if loc == s.room or (isinstance(loc, tuple) and loc[0] == s.room and loc in s.opened))


def valid_actions(w: World, s: State) -> list[str]:
    """Every action that changes the state (plus `look`), in a fixed order."""
    acts = []
    for room in w.neighbours(s.room):
        if room in w.locked and room not in s.unlocked:
            if f"{room} key" in s.held:
                acts.append(f"unlock {room} door")
        else:
            acts.append(f"go to {room}")
    here = [c for r, c in w.containers if r == s.room]
    acts += [f"open {c}" for c in here if (s.room, c) not in s.opened]
    acts += [f"take {t}" for t in _visible(w, s)]
    acts += [f"put {t} in {c}" for t in sorted(s.held) if not t.endswith(" key")
             for c in here if (s.room, c) in s.opened]
    return acts + ["look"]


def apply(w: World, s: State, action: str) -> State | None:
    """The state after a valid action; None for an invalid one (`look` keeps the state)."""
    if action == "look":
        return s
    if action not in valid_actions(w, s):
        return None
    verb, _, rest = action.partition(" ")
    if verb == "go":
        return dataclasses.replace(s, room=rest[len("to "):])
    if verb == "unlock":
        return dataclasses.replace(s, unlocked=s.unlocked | {rest[: -len(" door")]})
    if verb == "open":
        return dataclasses.replace(s, opened=s.opened | {(s.room, rest)})
    if verb == "take":
        return dataclasses.replace(s, held=s.held | {rest}, where=tuple(x for x in s.where if x[0] != rest))
    if verb == "put":
        thing, _, container = rest.partition(" in ")
        where = tuple(sorted(s.where + ((thing, (s.room, container)),), key=repr))
        return dataclasses.replace(s, held=s.held - {thing}, where=where)
    raise AssertionError(action)


def shortest_plan(w: World, s: State, limit: int = 200_000) -> list[str] | None:
    """A shortest action sequence from `s` to the goal (breadth-first; ties broken by the
    fixed action order, so the plan is deterministic); None if unreachable."""
    if goal_done(w, s):
        return []
    parent: dict[State, tuple[State, str] | None] = {s: None}
    frontier = collections.deque([s])
    while frontier and len(parent) < limit:
        cur = frontier.popleft()
        for a in valid_actions(w, cur)[:-1]:  # not `look`
            nxt = apply(w, cur, a)
            if nxt in parent:
                continue
            parent[nxt] = (cur, a)
            if goal_done(w, nxt):
                plan = []
                while parent[nxt] is not None:
                    nxt, a = parent[nxt]
                    plan.append(a)
                return plan[::-1]
            frontier.append(nxt)
    return None


# ----------------------------------------------------------------------------- generation


def _candidate(rng: random.Random) -> World:
    n = rng.randint(3, 5)
    rooms = tuple(rng.sample(COLOURS, n))
    doors = frozenset(frozenset((rooms[i], rooms[rng.randrange(i)])) for i in range(1, n))
    start = rooms[0]
    locked = frozenset(r for r in rooms[1:] if rng.random() < 0.45)
    containers = tuple((r, c) for r in rooms for c in rng.sample(CONTAINERS, rng.randint(0, 2)))
    spots = list(rooms) + list(containers)
    item = rng.choice(ITEMS)
    goal_spots = [c for c in containers if c[0] != start] or list(containers)
    if not goal_spots:
        raise ValueError("no container")
    goal = (item, rng.choice(goal_spots))
    placements = [(item, rng.choice([p for p in spots if p != goal[1]]))]
    others = rng.sample([i for i in ITEMS if i != item], rng.randint(0, 2))  # distractors
    placements += [(o, rng.choice(spots)) for o in others]
    placements += [(f"{r} key", rng.choice(spots)) for r in sorted(locked)]
    return World(rooms, doors, locked, containers, start, tuple(placements), goal)


def layout_key(w: World) -> tuple:
    """What makes two worlds the same layout (for the splits' disjointness)."""
    return (w.rooms, tuple(sorted(tuple(sorted(d)) for d in w.doors)), tuple(sorted(w.locked)), w.containers,
            tuple(sorted(w.placements, key=repr)), w.goal)


@functools.lru_cache(maxsize=4096)
def generate(seed: int) -> tuple[World, tuple[str, ...]]:
    """The world of a seed and its shortest plan: candidates drawn from the seed's generator
    until one is solvable in MIN_PLAN..MAX_PLAN actions."""
    rng = random.Random(seed)
    while True:
        try:
            w = _candidate(rng)
        except ValueError:
            continue
        plan = shortest_plan(w, initial_state(w))
        if plan is not None and MIN_PLAN <= len(plan) <= MAX_PLAN:
            return w, tuple(plan)


def _seeds(split: str) -> Iterator[int]:
    base = _SPLIT_SEEDS[split]
    return iter(range(base, base + 10 * SPLIT_SIZES[split] + 1000))


@functools.lru_cache(maxsize=None)
def _split_seeds(split: str) -> tuple[int, ...]:
    taken = set()
    if split == "test":
        taken = {layout_key(generate(s)[0]) for s in _split_seeds("train")}
    out = []
    for seed in _seeds(split):
        key = layout_key(generate(seed)[0])
        if key in taken:
            continue
        taken.add(key)
        out.append(seed)
        if len(out) == SPLIT_SIZES[split]:
            return tuple(out)
    raise RuntimeError(f"rooms: could not draw {SPLIT_SIZES[split]} distinct {split} layouts")


def catalogue(split: str) -> list[Task]:
    """512 train or 64 test tasks (their layouts disjoint); category = the number of rooms."""
    if split not in SPLITS:
        raise ValueError(f"rooms has no split {split!r}; splits: {', '.join(SPLITS)}")
    tasks = []
    for i, seed in enumerate(_split_seeds(split)):
        world, plan = generate(seed)
        tasks.append(Task(NAME, f"{split}-{i}", split, seed=seed, category=f"{len(world.rooms)} rooms",
                          spec={"seed": seed, "plan_length": len(plan)}))
    return tasks


# ----------------------------------------------------------------------------- the env


def _thing(t: str) -> str:
    return f"the {t}"


def describe(w: World, s: State) -> str:
    """What the agent sees of its room, its hands and the goal."""
    item, (room, container) = w.goal
    lines = [f"Goal: put the {item} in the {container} of the {room} room.",
             f"You are in the {s.room} room."]
    for r in w.neighbours(s.room):
        state = " (locked)" if r in w.locked and r not in s.unlocked else ""
        lines.append(f"A door leads to the {r} room{state}.")
    for r, c in w.containers:
        if r != s.room:
            continue
        if (r, c) in s.opened:
            inside = [t for t, loc in s.where if loc == (r, c)]
            lines.append(f"The {c} is open; in it: {', '.join(map(_thing, sorted(inside))) or 'nothing'}.")
        else:
            lines.append(f"The {c} is closed.")
    floor = sorted(t for t, loc in s.where if loc == s.room)
    if floor:
        lines.append(f"On the floor: {', '.join(map(_thing, floor))}.")
    lines.append(f"You carry: {', '.join(map(_thing, sorted(s.held))) or 'nothing'}.")
    return "\n".join(lines)


def checklist(w: World, plan: tuple[str, ...], s: State) -> list[dict]:
    """The task's sub-goals (from its shortest plan at reset) and whether each holds now."""
    item, place = w.goal
    goals = []
    for a in plan:
        if a.startswith("take ") and a.endswith(" key"):
            key = a[len("take "):]
            room = key[: -len(" key")]
            goals.append({"description": f"find the {key}", "done": key in s.held or room in s.unlocked})
        elif a.startswith("unlock "):
            room = a[len("unlock "):-len(" door")]
            goals.append({"description": f"unlock the {room} door", "done": room in s.unlocked})
        elif a == f"take {item}":
            goals.append({"description": f"find the {item}", "done": item in s.held or s.location(item) == place})
    goals.append({"description": f"put the {item} in the {place[1]} of the {place[0]} room",
                  "done": goal_done(w, s)})
    return goals


def read_action(text: str) -> str:
    """The action of the agent's text: inside <action> tags if it has them, else its first
    non-empty line after any reasoning; lower-cased, whitespace collapsed, articles dropped."""
    parsed = parse_action(text)
    raw = parsed.action if parsed.action is not None else next(
        (line for line in text.rsplit("</think>", 1)[-1].splitlines() if line.strip()), "")
    words = [w for w in raw.lower().replace(".", " ").split() if w not in ("the", "a", "an", "room")]
    return " ".join(words)[:200]


class RoomsEnv:
    """One task's house; `step_limit` actions at most (invalid ones count)."""

    name = NAME

    def __init__(self, step_limit: int = 20, show_actions: bool = True):
        self.step_limit, self.show_actions = step_limit, show_actions
        self.world: World | None = None

    def reset(self, task: Task) -> Observation:
        self.world, self.plan = generate(int(task.spec["seed"]))
        self.state, self.steps = initial_state(self.world), 0
        return self._observation(describe(self.world, self.state))

    def _observation(self, text: str) -> Observation:
        w, s = self.world, self.state
        valid = valid_actions(w, s)
        if self.show_actions:
            text += "\nActions: " + "; ".join(valid)
        plan = shortest_plan(w, s) or []
        privileged = {"gold_actions": list(self.plan), "valid_actions": valid,
                      "next_walkthrough_action": plan[0] if plan else None, "plan_left": len(plan),
                      "goals": checklist(w, self.plan, s)}
        return Observation(text, privileged)

    def step(self, action_text: str) -> StepResult:
        if self.world is None:
            raise RuntimeError("step() before reset()")
        action = read_action(action_text)
        nxt = apply(self.world, self.state, action)
        self.steps += 1
        invalid = nxt is None
        if not invalid:
            self.state = nxt
        won = goal_done(self.world, self.state)
        done = won or self.steps >= self.step_limit
        head = "Nothing happens." if invalid else ("Done: the goal holds." if won else "")
        text = "\n".join(t for t in (head, describe(self.world, self.state)) if t)
        info = {"won": won, "invalid": invalid, "steps": self.steps, "score": float(won)}
        return StepResult(self._observation(text), reward=float(won), done=done, info=info, action=action)

    def close(self) -> None:
        pass
