"""Task specs ("env:split:n"), the training task stream and the balanced evaluation sets."""

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from jaxscaffold import seeds
from jaxscaffold.config import typed
from jaxscaffold.envs import registry
from jaxscaffold.train.tasks import (TaskSpec, TaskStream, category_counts, describe_tasks, env_names,
                                     load_eval_tasks, load_tasks, parse_task_spec)
from tests.train.configs import ROOT, load_config


def test_task_spec_entries():
    assert parse_task_spec(" sciworld:train:4, bfcl:validation ,letters::2,") == [
        TaskSpec("sciworld", "train", 4), TaskSpec("bfcl", "validation"), TaskSpec("letters", "", 2)]
    assert env_names("sciworld,bfcl:validation") == ["sciworld", "bfcl"]
    for bad in ("letters:test:x", "letters:a:1:2"):
        with pytest.raises(ValueError, match="task spec entry"):
            parse_task_spec(bad)


def test_load_tasks_takes_each_entrys_split_and_count():
    tests = load_tasks("letters", "test")
    assert tests and {t.split for t in tests} == {"test"}
    assert load_tasks("letters::2", "test") == tests[:2]
    assert load_tasks("letters", "test", limit=3) == tests[:3]
    assert load_tasks("letters:train:1,letters", "test", limit=2) == load_tasks("letters", "train")[:1] + tests[:2]


def test_task_stream_resumes_where_it_was():
    stream = TaskStream(list(range(5)), seed=3)
    first = stream.take(7)
    assert sorted(first[:5]) == list(range(5))  # an epoch is a permutation
    state = stream.get_state()
    rest = stream.take(4)
    again = TaskStream(list(range(5)), seed=3)
    again.set_state(state)
    assert again.take(4) == rest
    with pytest.raises(ValueError, match="no training tasks"):
        TaskStream([], seed=0)


# ---------------------------------------------------------------------- balanced evaluation sets

def _round_robin(available: dict, n: int) -> dict:
    """A reference allocation: one task per category in turn, skipping the exhausted ones."""
    counts = dict.fromkeys(available, 0)
    while sum(counts.values()) < n:
        for k in sorted(available):
            if counts[k] < available[k] and sum(counts.values()) < n:
                counts[k] += 1
    return counts


def test_category_counts_are_equal_with_the_remainder_spread():
    rng = np.random.default_rng(0)
    counts = category_counts({"a": 2, "b": 10, "c": 10}, 15, rng)
    assert counts["a"] == 2 and sorted([counts["b"], counts["c"]]) == [6, 7]  # 15 = 2 + 6 + 7
    assert category_counts({"a": 2, "b": 3}, 9, rng) == {"a": 2, "b": 3}  # more than there are: all
    for n in range(0, 23):
        got = category_counts({"a": 2, "b": 10, "c": 10}, n, np.random.default_rng(n))
        assert sorted(got.values()) == sorted(_round_robin({"a": 2, "b": 10, "c": 10}, n).values()), n


def _eval_set(cfg):
    cfg = typed(cfg)
    return load_eval_tasks(cfg.envs.eval, cfg.envs.eval_split, cfg.eval.tasks, seeds.derive(cfg.seed, "eval_tasks"))


def test_fee_eval_sets_cover_every_category_evenly():
    """configs/fee.py: 128 ScienceWorld test tasks over all of the split's task types (equal
    counts up to one, all of a type with fewer), and BFCL's 400 validation entries; with
    eval.tasks = 128 BFCL gives 32 of each category. The same on every call."""
    tasks = _eval_set(load_config("fee"))
    assert tasks == _eval_set(load_config("fee"))  # deterministic
    assert len({(t.env, t.task_id) for t in tasks}) == len(tasks)  # no task twice
    sw_all = registry.catalogue("sciworld", "test")
    available = Counter(t.spec["task_name"] for t in sw_all)  # the catalogue's own type field
    got = Counter(t.category for t in tasks if t.env == "sciworld")
    assert sum(got.values()) == 128 and set(got) == set(available) and len(available) == 29
    assert sorted(got.values()) == sorted(_round_robin(dict(available), 128).values())
    assert {t.task_id for t in tasks if t.env == "sciworld"} <= {t.task_id for t in sw_all}
    bfcl = Counter(t.spec["category"] for t in tasks if t.env == "bfcl")
    assert bfcl == {"base": 100, "miss_func": 100, "miss_param": 100, "long_context": 100}
    assert all(t.category == t.spec["category"] for t in tasks if t.env == "bfcl")
    assert describe_tasks(tasks) == "sciworld 128 tasks (29 categories), bfcl 400 tasks (4 categories)"
    capped = _eval_set(load_config("fee", **{"eval.tasks": 128}))
    assert Counter(t.spec["category"] for t in capped if t.env == "bfcl") == dict.fromkeys(bfcl, 32)
    # Another run seed draws other variations in the same proportions.
    other = _eval_set(load_config("fee", seed=1))
    assert [t.task_id for t in other if t.env == "sciworld"] != [t.task_id for t in tasks if t.env == "sciworld"]
    assert sorted(Counter(t.category for t in other if t.env == "sciworld").values()) == sorted(got.values())


def test_eval_set_of_an_env_without_categories_and_an_entrys_count():
    tasks = load_eval_tasks("letters:test:5", "test", 0, seed=3)
    assert len(tasks) == 5 and {t.task_id for t in tasks} <= {t.task_id for t in load_tasks("letters", "test")}
    assert len(load_eval_tasks("letters:test:5", "test", 2, seed=3)) == 2  # eval.tasks caps the entry's n
    assert load_eval_tasks("letters:test:5", "test", 0, seed=4) != tasks  # a seeded draw
    assert load_eval_tasks("letters", "test", 0, seed=3) == load_tasks("letters", "test")  # 0: all, in order


def test_list_tasks_prints_the_eval_set_as_json(monkeypatch, capsys):
    """eval.py's main in this process for the listing (saving a process start), and as a
    command for the bad input."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "launch"))
    import eval as eval_launcher
    capsys.readouterr()
    eval_launcher.main(["--config", "fee.py", "--config.eval.tasks=8", "--list-tasks", "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = _eval_set(load_config("fee", **{"eval.tasks": 8}))
    assert rows == [{"env": t.env, "task_id": t.task_id, "category": t.category} for t in expected]
    assert Counter(r["category"] for r in rows if r["env"] == "bfcl") == {
        "base": 2, "miss_func": 2, "miss_param": 2, "long_context": 2}
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "eval.py"), "--list-tasks"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--config" in bad.stderr
