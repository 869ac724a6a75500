"""ScienceWorld action guidance under deviation: is every hint valid, and does following it help?

A gold policy that deviates: each step, with probability `DEVIATE` (0.3) it takes a random
valid action other than the hint (a random template, then one of its actions; never `focus
on`, which ends an episode on a wrong object); otherwise it follows the hint
(`feedback.sciworld_ag.GoldGuide`, computed inside the env on every step), or deviates when
there is none. Each hint is checked against the simulator's valid actions listed again,
independently, at that moment: it must name one of them (the same template and objects; the
listing spells an object by a randomly chosen one of its names, so the names are compared
through the simulator's referent table), or answer the ambiguity prompt on screen. Followed
hints are also checked by the simulator itself (rejected: "No known action matches"; or an
"Ambiguous request" prompt). For comparison, the hint before re-planning (the next action of
the gold path fixed at reset, by the agent's in-order gold progress) is checked the same way.

Figures: ag_hint_valid_rate (goal 1.0), ag_hint_valid_rate_fixed_path (the old hint),
ag_hint_rate (share of steps with a hint), ag_hint_progress_rate (share of followed hints after
which the score rose), the same for gold hints on the undeviated path (the gold path's own
rate, a ceiling), after a deviation and for restore hints; rejected / ambiguous shares of the
followed hints; steps without a hint because the gold step cannot be done; won rate.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import random

from benchmarks.common import REPORT

DEVIATE = 0.3
MAX_STEPS = 15  # the training horizon


def _episode(env, task, seed: int) -> collections.Counter:
    from jaxscaffold.feedback.enrichers import gold_progress
    from jaxscaffold.feedback.sciworld_ag import SimView

    rng = random.Random(seed)
    c = collections.Counter()
    obs = env.reset(dataclasses.replace(task, spec={**task.spec, "feedback": {"ag": None}}))
    gold = obs.privileged["gold_actions"]
    actions: list[str] = []
    deviated, score = False, 0
    c["episodes"] += 1
    for _ in range(MAX_STEPS):
        p = obs.privileged
        hint, source = p["ag_hint"], p["ag_hint_source"]
        raw = p["observation"]
        view = SimView.from_simulator(env.simulator, raw)  # a listing of its own, taken now
        c["steps"] += 1
        old = gold[gold_progress(gold, actions)] if gold_progress(gold, actions) < len(gold) else None
        if old is not None:
            c["old_hints"] += 1
            c["old_valid"] += _listed(old, view)
        if hint is not None:
            c["hints"] += 1
            c["valid"] += _listed(hint, view)
            c[f"source_{source}"] += 1
        else:
            c[f"none_{source}"] += 1
        follow = hint is not None and rng.random() >= DEVIATE
        action = hint if follow else _deviation(rng, view, hint)
        deviated = deviated or not follow
        r = env.step(f"<action>{action}</action>")
        actions.append(action)
        new_score = r.info.get("score", score)
        if follow:
            kind = "restore" if source == "restore" else ("gold_after_deviation" if deviated else "gold_on_path")
            c[f"followed_{kind}"] += 1
            c[f"progress_{kind}"] += new_score > score
            c["followed"] += 1
            c["progress"] += new_score > score
            said = r.observation.privileged["observation"].lower()
            c["followed_rejected"] += bool(r.info.get("invalid"))
            c["followed_ambiguous"] += source != "choice" and "ambiguous request" in said
        score = new_score
        obs = r.observation
        if r.done:
            c["won"] += bool(r.info.get("won"))
            break
    return c


def _listed(action: str, view) -> bool:
    """`action` names an action of this listing (its template and objects), or answers the
    ambiguity prompt on screen with one of its numbers."""
    from jaxscaffold.feedback.sciworld_ag import resolve

    if action.isdigit():
        return f"{action}:" in view.observation
    return resolve(action, view) is not None


def _deviation(rng: random.Random, view, hint: str | None) -> str:
    """A random valid action other than the hint: a template first (so that moves, opening
    and taking are as likely as the hundreds of 'connect X to Y'), then one of its actions."""
    by_template: dict[int, list[str]] = {}
    for e in view.valid:
        if e.action != hint and not e.action.startswith("focus on"):
            by_template.setdefault(e.template_id, []).append(e.action)
    return rng.choice(by_template[rng.choice(sorted(by_template))])


def _worker(tasks_and_seeds) -> collections.Counter:
    from jaxscaffold.envs.sciworld import ScienceWorldEnv
    from jaxscaffold.feedback.sciworld_ag import GoldGuide

    env = ScienceWorldEnv(step_limit=1000, ag_guide=GoldGuide)
    total = collections.Counter()
    try:
        for task, seed in tasks_and_seeds:
            total += _episode(env, task, seed)
    finally:
        env.close()
    return total


def _rate(c, num, den) -> float:
    return c[num] / c[den] if c[den] else float("nan")


def run(quick: bool = False) -> None:
    from jaxscaffold.envs.sciworld import catalogue

    n = 24 if quick else 100
    tasks = catalogue("train", level="L0")
    tasks = tasks[:: max(1, len(tasks) // n)][:n]  # spread over the task types
    workers = max(1, min(2, os.cpu_count() or 1))
    jobs = [[(t, 1000 + i) for i, t in enumerate(tasks) if i % workers == w] for w in range(workers)]
    REPORT.say(f"# feedback: {len(tasks)} ScienceWorld L0-train episodes, gold policy deviating with p={DEVIATE} "
               f"per step, <= {MAX_STEPS} steps, {workers} processes")
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        c = sum(pool.map(_worker, jobs), collections.Counter())
    REPORT.figure("episodes", c["episodes"], "episodes")
    REPORT.figure("ag_hint_valid_rate", _rate(c, "valid", "hints"), "share")
    REPORT.figure("ag_hint_valid_rate_fixed_path", _rate(c, "old_valid", "old_hints"), "share",
                  note="(the hint before re-planning)")
    REPORT.figure("ag_hint_rate", _rate(c, "hints", "steps"), "share")
    REPORT.figure("ag_hint_progress_rate", _rate(c, "progress", "followed"), "share")
    for kind in ("gold_on_path", "gold_after_deviation", "restore"):
        REPORT.figure(f"ag_hint_progress_rate_{kind}", _rate(c, f"progress_{kind}", f"followed_{kind}"), "share")
        REPORT.figure(f"ag_hints_followed_{kind}", c[f"followed_{kind}"], "hints")
    REPORT.figure("ag_followed_hints_rejected", _rate(c, "followed_rejected", "followed"), "share")
    REPORT.figure("ag_followed_hints_ambiguous", _rate(c, "followed_ambiguous", "followed"), "share")
    REPORT.figure("ag_no_hint_gold_step_invalid", _rate(c, "none_none:gold_step_invalid", "steps"), "share")
    REPORT.figure("won_rate", _rate(c, "won", "episodes"), "share")
