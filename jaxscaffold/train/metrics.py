"""Rollout metrics: success, reward, lengths, success per env, category and split
(`evaluation.breakdown`), feedback counts and the share of informative groups, computed from
JSON episode summaries (what processes exchange)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxscaffold.feedback import schedule as schedule_lib
from jaxscaffold.rl.advantages import informative
from jaxscaffold.train.evaluation import breakdown
from jaxscaffold.train.multihost import allgather_json
from jaxscaffold.episodes.episode import Episode


def episode_summaries(episodes: Sequence[Episode]) -> list[dict]:
    """What metrics and the feedback log need of each episode, as JSON (sent between processes)."""
    out, seen = [], {}
    for e in episodes:
        rollout = seen[e.group] = seen.get(e.group, -1) + 1  # the episode's index in its group
        out.append({"group": e.group, "rollout": rollout, "task": e.task.task_id, "env": e.task.env,
                    "category": e.task.category, "split": e.task.split, "tags": list(e.task.tags),
                    "failed": e.failure is not None, "reward": float(e.reward), "won": bool(e.won),
                    "steps": e.steps, "truncated": bool(e.truncated),
                    "response_tokens": int(sum(sum(c.assistant_mask) for c in e.training_rows())),
                    "feedback": [[int(s), k] for s, k in e.feedback]})
    return out


def summary_metrics(summaries: Sequence[dict], prefix: str) -> dict[str, float]:
    """`rollout_metrics` of episode summaries (see `episode_summaries`)."""
    ok = [e for e in summaries if not e["failed"]]
    out = {f"{prefix}/infra_failures": float(len(summaries) - len(ok))}
    if not ok:
        return out
    out[f"{prefix}/reward"] = float(np.mean([e["reward"] for e in ok]))
    out[f"{prefix}/success"] = float(np.mean([e["won"] for e in ok]))
    out[f"{prefix}/env_steps"] = float(np.mean([e["steps"] for e in ok]))
    out[f"{prefix}/response_tokens"] = float(np.mean([e["response_tokens"] for e in ok]))
    out[f"{prefix}/truncated"] = float(np.mean([e["truncated"] for e in ok]))
    out.update(breakdown(ok, prefix))  # per env, per category (tau2's domains), per split
    for kind in schedule_lib.KINDS:
        # Enrichments (one per episode step that got `kind`), and the groups that got any.
        out[f"{prefix}/feedback_{kind}"] = float(sum(k == kind for e in ok for _, k in e["feedback"]))
        out[f"{prefix}/feedback_groups_{kind}"] = float(len({e["group"] for e in ok
                                                             if any(k == kind for _, k in e["feedback"])}))
    return out


def rollout_metrics(episodes: list[Episode], prefix: str, *, across_processes: bool = False) -> dict[str, float]:
    """Success, reward, lengths, per-env success and feedback counts of `episodes`.
    `across_processes`: over every process's episodes (a collective), the same on every host."""
    summaries = episode_summaries(episodes)
    if across_processes:
        summaries = [s for part in allgather_json(summaries) for s in part]
    return summary_metrics(summaries, prefix)


def informative_share(summaries: Sequence[dict]) -> float:
    """The share of groups whose rewards are not all equal (GRPO learns only from those).
    On rewards, not successes: a shaped or continuous reward can make a group informative."""
    groups: dict[int, list[float]] = {}
    for e in summaries:
        if not e["failed"]:
            groups.setdefault(e["group"], []).append(e["reward"])
    return float(np.mean([informative(r) for r in groups.values()])) if groups else 0.0
