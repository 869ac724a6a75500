"""The scores an evaluation reports, as the FEE paper's table does: success per env, per
category of each env (ScienceWorld task type, BFCL category, tau2 domain), per split where an
env ran several (ALFWorld in- and out-of-distribution, as the RWML paper's table) and `score`, the mean over the
paper's items: each of BFCL's categories and every other env as a whole (with ScienceWorld and
BFCL, the five-item average of its headline numbers); beside them the success of each tag
(`Task.tags`: BFCL's difficulty tiers, the paper's stratified analysis). Computed from JSON episode summaries
(`metrics.episode_summaries`), the same on every process."""

from __future__ import annotations

from typing import Sequence

import numpy as np

# Envs whose categories are the paper's items (its table reports BFCL's four subsets and
# their mean beside ScienceWorld); any other env counts as one item.
SCORED_BY_CATEGORY = ("bfcl",)


def env_key(prefix: str, env: str) -> str:
    """The metric of an env's success: "eval/success_sciworld"."""
    return f"{prefix}/success_{env}"


def category_key(prefix: str, env: str, category: str) -> str:
    """The metric of a category's success: "eval/success_bfcl/miss_param"."""
    return f"{prefix}/success_{env}/{category}"


def breakdown(ok: Sequence[dict], prefix: str) -> dict[str, float]:
    """Success of episodes that ran, per env (`env_key`), per category of each env
    (`category_key`: ScienceWorld task type, BFCL category, tau2 domain) and, for an env run on
    more than one split, per split (`category_key` with the split: ALFWorld's
    `success_alfworld/valid_seen` in-distribution and `.../valid_unseen` out-of-distribution),
    and per tag (`Task.tags`: BFCL's `tier_easy|medium|hard`)."""
    out: dict[str, float] = {}
    for env in sorted({e["env"] for e in ok}):
        sub = [e for e in ok if e["env"] == env]
        out[env_key(prefix, env)] = float(np.mean([e["won"] for e in sub]))
        for field in ("category", "split"):
            values = {e.get(field, "") for e in sub} - {""}
            if field == "split" and len(values) < 2:
                continue
            for v in values:
                out[category_key(prefix, env, v)] = float(np.mean([e["won"] for e in sub if e.get(field, "") == v]))
        # Tags (e.g. BFCL's difficulty tiers) get a success each, like categories, outside the score.
        for tag in sorted({t for e in sub for t in e.get("tags", ())}):
            out[category_key(prefix, env, tag)] = float(np.mean([e["won"] for e in sub if tag in e.get("tags", ())]))
    return out


def score_items(envs_categories: dict[str, Sequence[str]], prefix: str) -> list[str]:
    """The metrics `score` averages, for the envs (and their categories) an evaluation ran."""
    items = []
    for env in sorted(envs_categories):
        cats = [c for c in envs_categories[env] if c]
        if env in SCORED_BY_CATEGORY and cats:
            items += [category_key(prefix, env, c) for c in sorted(cats)]
        else:
            items.append(env_key(prefix, env))
    return items


def score_metrics(summaries: Sequence[dict], prefix: str = "eval") -> dict[str, float]:
    """Per-env, per-category and per-tag success of the episodes that ran (infrastructure
    failures excluded, as `summary_metrics` does; tags: `Task.tags`, e.g.
    "eval/success_bfcl/tier_hard") and `<prefix>/score`, the unweighted mean of `score_items`
    (categories only)."""
    ok = [e for e in summaries if not e["failed"]]
    if not ok:
        return {}
    out = breakdown(ok, prefix)
    cats: dict[str, set[str]] = {}
    for e in ok:
        cats.setdefault(e["env"], set()).add(e.get("category", ""))
    items = score_items({env: sorted(names) for env, names in cats.items()}, prefix)
    out[f"{prefix}/score"] = float(np.mean([out[k] for k in items]))
    return out
