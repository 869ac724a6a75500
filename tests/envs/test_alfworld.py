"""ALFWorld adapter: catalogue, official observations, walkthroughs, adversarial actions."""

from __future__ import annotations

import collections
import importlib
import os

import pytest

from jaxscaffold.envs import alfworld as A
from jaxscaffold.envs.base import Task

EXPECTED_COUNTS = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}


def _engine_or_skip():
    for mod in ("textworld", "fast_downward", "alfworld"):
        pytest.importorskip(mod)


@pytest.fixture(scope="module")
def env(alfworld_data):
    _engine_or_skip()
    e = A.ALFWorldEnv(data_dir=alfworld_data.root)
    yield e
    e.close()


@pytest.fixture(scope="module")
def unseen(alfworld_data):
    return A.catalogue("valid_unseen", alfworld_data.root)


def _by_type(tasks, per_type):
    groups = collections.defaultdict(list)
    for t in tasks:
        if len(groups[t.spec["task_type"]]) < per_type:
            groups[t.spec["task_type"]].append(t)
    return [t for tt in A.TASK_TYPES for t in groups[tt]]


# ---- catalogue -------------------------------------------------------------------------------


def test_catalogue_counts_from_tarball_listing(alfworld_data):
    by_split = {s: A.tasks_from_relpaths(s, alfworld_data.members) for s in A.SPLITS}
    assert {s: len(t) for s, t in by_split.items()} == EXPECTED_COUNTS
    for split, tasks in by_split.items():
        assert {t.spec["task_type"] for t in tasks} == set(A.TASK_TYPES), split
        assert len({t.task_id for t in tasks}) == len(tasks)


def test_catalogue_from_folders(alfworld_data, monkeypatch):
    root = alfworld_data.root
    for split in ("valid_seen", "valid_unseen"):
        tasks = A.catalogue(split, root)
        assert len(tasks) == EXPECTED_COUNTS[split]
        assert {t.spec["task_type"] for t in tasks} == set(A.TASK_TYPES)
        assert tasks == sorted(tasks, key=lambda t: t.task_id)
    t = A.catalogue("valid_unseen", root)[0]
    assert t.env == "alfworld" and t.split == "valid_unseen"
    assert t.spec["gamefile"].startswith("valid_unseen/") and t.spec["gamefile"].endswith("game.tw-pddl")
    assert t.task_id == "/".join(t.spec["gamefile"].split("/")[1:3])
    assert {"task_type", "object", "parent", "mrecep", "scene"} <= set(t.spec)
    # aliases, the json_2.1.1 folder itself, and $ALFWORLD_DATA
    assert A.catalogue("eval_out_of_distribution", root) == A.catalogue("valid_unseen", root)
    assert A.catalogue("valid_seen", root / "json_2.1.1") == A.catalogue("valid_seen", root)
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    assert len(A.catalogue("valid_seen")) == 140
    # the partially unpacked train split matches the tarball listing for those folders
    train = A.catalogue("train")
    listed = [m for m in alfworld_data.members
              if m.split("/")[0] == "train" and m.split("/")[1] in alfworld_data.train_folders]
    assert len(train) == len(listed) > 0


def test_missing_data_dir_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no games in ALFWorld's default ~/.cache/alfworld either
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        A.catalogue("valid_unseen")
    with pytest.raises(FileNotFoundError, match=r"json_2\.1\.1/<split>/<task-folder>/<trial>/game\.tw-pddl"):
        A.catalogue("valid_unseen", tmp_path / "nowhere")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"\$ALFWORLD_DATA"):
        A.catalogue("train")
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        A.catalogue("test", tmp_path)
    # the env resolves its data dir lazily (the pool constructs it with no arguments)
    cls = getattr(importlib.import_module("jaxscaffold.envs.alfworld"), "ALFWorldEnv")
    e = cls(data_dir=tmp_path / "nowhere")
    task = Task(env="alfworld", task_id="x/y", split="valid_unseen",
                spec={"gamefile": "valid_unseen/x/y/game.tw-pddl"})
    with pytest.raises(FileNotFoundError, match="expected"):
        e.reset(task)
    e.close()


# ---- action text -------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("go to desk 1", "go to desk 1"),
    ("  Go To  Desk 1.  ", "go to desk 1"),
    ("<think>I should look.</think>\n<action>take apple 2 from garbagecan 1</action>",
     "take apple 2 from garbagecan 1"),
    ("<action>look</action> then <action>inventory</action>", "inventory"),
    ("<action><action>open fridge 1</action></action>", "open fridge 1"),
    ("<think>hmm</think><action>go to fridge 1", "go to fridge 1"),
    ("<think>unterminated thoughts go to desk 1", ""),
    ("<ACTION>`use desklamp 1`</ACTION>", "use desklamp 1"),
    ("> examine desk 1", "examine desk 1"),
    ("\uff47\uff4f to desk 1", "go to desk 1"),  # full-width letters (NFKC)
    ("go\u200b to desk 1\x00", "go to desk 1"),  # zero-width and control characters dropped
    (None, ""),
    (42, ""),
])
def test_clean_action(text, expected):
    assert A.clean_action(text) == expected


# ---- episodes ----------------------------------------------------------------------------------


def test_initial_observation_and_privileged(env, unseen, alfworld_data):
    task = next(t for t in unseen if t.spec["task_type"] == "pick_heat_then_place_in_recep")
    ob = env.reset(task)
    assert ob.text.startswith("You are in the middle of a room. Looking quickly around you, you see ")
    assert "\n\nYour task is to: " in ob.text and "Welcome to TextWorld" not in ob.text
    p = ob.privileged
    assert p["task_type"] == "pick_heat_then_place_in_recep"
    assert p["walkthrough"] and p["next_walkthrough_action"] == p["walkthrough"][0]
    assert p["walkthrough"][0] in p["admissible_commands"] and p["valid_actions"] == p["admissible_commands"]
    assert p["admissible_commands"] == sorted(p["admissible_commands"])
    assert "look" in p["admissible_commands"] and "inventory" in p["admissible_commands"]
    assert [g["done"] for g in p["goal_progress"]] == [False, False, False]
    assert p["subgoals_total"] == 3 and p["subgoals_done"] == 0
    banner = A.ALFWorldEnv(data_dir=alfworld_data.root, keep_banner=True)
    try:
        assert banner.reset(task).text.startswith("-= Welcome to TextWorld, ALFRED! =-")
    finally:
        banner.close()


def _play(env, task, actions):
    ob = env.reset(task)
    results = []
    for a in actions if actions is not None else ob.privileged["walkthrough"]:
        results.append(env.step(a))
    return ob, results


def test_one_walkthrough_wins_with_reward_scale(alfworld_data, unseen):
    _engine_or_skip()
    e = A.ALFWorldEnv(data_dir=alfworld_data.root, reward_scale=10.0)
    try:
        task = next(t for t in unseen if t.spec["task_type"] == "pick_and_place_simple")
        ob, results = _play(e, task, None)
        assert [r.reward for r in results[:-1]] == [0.0] * (len(results) - 1)
        last = results[-1]
        assert last.reward == 10.0 and last.done and last.info["won"] and not last.info["truncated"]
        assert not any(r.done for r in results[:-1])
        after = e.step("look")  # stepping a finished episode is harmless
        assert after.done and after.reward == 0.0 and after.info["invalid"]
    finally:
        e.close()


@pytest.mark.slow
def test_walkthroughs_win_on_valid_unseen(env, unseen):
    tasks = _by_type(unseen, per_type=2)  # every task type, twice (about 5 s a game)
    assert len(tasks) == 12 and {t.spec["task_type"] for t in tasks} == set(A.TASK_TYPES)
    for task in tasks:
        ob = env.reset(task)
        walkthrough = ob.privileged["walkthrough"]
        done_counts = [ob.privileged["subgoals_done"]]
        for i, action in enumerate(walkthrough):
            assert ob.privileged["next_walkthrough_action"] == action
            r = env.step(action)
            assert not r.info["invalid"], (task.task_id, action)
            ob = r.observation
            assert r.done == (i == len(walkthrough) - 1), task.task_id
            done_counts.append(ob.privileged["subgoals_done"])
        assert r.reward == 1.0 and r.info["won"] and r.info["steps"] == len(walkthrough)
        assert ob.privileged["next_walkthrough_action"] is None and ob.privileged["on_walkthrough"]
        # sub-goal progress from the facts alone (not the won flag) reaches the goal ...
        raw = A._goal_progress(task.spec["task_type"], task.spec, env._infos["facts"])
        assert raw and all(g["done"] for g in raw), (task.task_id, raw)
        # ... starting from nothing (pick_two may start with one object in place)
        assert done_counts[0] == 0 or task.spec["task_type"] == "pick_two_obj_and_place"
        assert done_counts[-1] == ob.privileged["subgoals_total"]


def test_adversarial_outputs_execute_nothing(env, unseen, tmp_path):
    sentinel = tmp_path / "pwned"
    evil = [
        f"__import__('os').system('touch {sentinel}')",
        f"<action>__import__('os').system('touch {sentinel}')</action>",
        "import os; os.remove('/')",
        f"open('{sentinel}', 'w').write('x')",
        "exec(\"print(1)\")",
        "eval('1+1')",
        "$(touch /tmp/x) `rm -rf /` ; ls",
        "{{7*7}} ${7*7} %s %n",
        "A" * 1_000_000,
        "go to desk 1 " * 10_000,
        "<action>" * 1000 + "dance" + "</action>" * 3,
        "<action><think>go to</action> desk 1</think></action>",
        "<action></action>",
        "</action>go to desk 1<action>",
        "",
        "   \n\t ",
        "\x00\x01\x02\ud800",
        "🙂🔥 go to 🛏️ 1",
        "\u202egoto desk 1\u202c",
        "take " + "ｘ" * 500,
        "go to desk 99",
        "take apple 1 from the moon",
    ]
    task = next(t for t in unseen if t.spec["task_type"] == "pick_clean_then_place_in_recep")
    ob = env.reset(task)
    walkthrough = ob.privileged["walkthrough"]
    env.step_limit = len(evil) + len(walkthrough) + 5
    admissible = list(ob.privileged["admissible_commands"])
    try:
        for text in evil:
            r = env.step(text)
            assert r.observation.text == A.NOTHING_HAPPENS, text[:80]
            assert r.info["invalid"] and r.reward == 0.0 and not r.done
            assert r.observation.privileged["admissible_commands"] == admissible
            assert len(r.info["command"]) <= A.MAX_ACTION_CHARS
        assert not sentinel.exists()
        # the env is still usable: the walkthrough still wins
        for action in walkthrough:
            r = env.step(f"<think>next</think><action>{action}</action>")
            assert not r.info["invalid"]
        assert r.done and r.reward == 1.0 and r.info["steps"] == len(evil) + len(walkthrough)
    finally:
        env.step_limit = 50


def test_invalid_commands_match_the_engine(env, unseen):
    """The adapter answers non-admissible commands itself; the engine answers the same."""
    ob = env.reset(unseen[0])
    obs, score, done, infos = env._gym.step("dance with the fridge")
    assert obs == A.NOTHING_HAPPENS and score == 0 and not done
    assert infos["admissible_commands"] == ob.privileged["admissible_commands"]


def test_step_limit(alfworld_data, unseen):
    _engine_or_skip()
    e = A.ALFWorldEnv(data_dir=alfworld_data.root, step_limit=3)
    try:
        e.reset(unseen[1])
        rs = [e.step("look"), e.step("nonsense"), e.step("inventory")]
        assert [r.done for r in rs] == [False, False, True]
        assert rs[-1].info["truncated"] and not rs[-1].info["won"] and rs[-1].reward == 0.0
        assert [r.info["invalid"] for r in rs] == [False, True, False]
        assert e.step("look").info["episode_over"]
        e.reset(unseen[1])  # a reset starts afresh
        assert not e.step("look").done
    finally:
        e.close()


@pytest.mark.slow
def test_leaving_the_walkthrough_and_replanning(env, unseen):
    task = next(t for t in unseen if t.spec["task_type"] == "pick_cool_then_place_in_recep")
    ob = env.reset(task)
    walkthrough = ob.privileged["walkthrough"]
    r = env.step("look")  # neutral
    assert r.observation.privileged["next_walkthrough_action"] == walkthrough[0]
    detour = next(c for c in ob.privileged["admissible_commands"]
                  if c.startswith("go to ") and c != walkthrough[0])
    r = env.step(detour)
    assert not r.observation.privileged["on_walkthrough"]
    assert r.observation.privileged["next_walkthrough_action"] is None
    plan = env.expert_plan()
    assert plan, "the planner found no plan"
    for action in plan:
        r = env.step(action)
        assert not r.info["invalid"], action
    assert r.done and r.info["won"] and r.reward == 1.0


def test_env_protocol_surface(monkeypatch):
    _engine_or_skip()
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    A._import_engine()  # `import alfworld` sets $ALFWORLD_DATA; the adapter undoes that
    assert "ALFWORLD_DATA" not in os.environ
    e = A.ALFWorldEnv()
    assert e.name == "alfworld"
    with pytest.raises(Exception):
        e.step("look")
    e.close()


def test_reset_same_game_starts_fresh(env, unseen):
    task = next(t for t in unseen if t.spec["task_type"] == "pick_two_obj_and_place")
    first = env.reset(task)
    walkthrough = first.privileged["walkthrough"]
    for action in walkthrough[:2]:
        assert not env.step(action).info["invalid"]
    import fast_downward
    translated = fast_downward.pddl2sas.cache_info().misses
    again = env.reset(task)  # the same game: the engine state is rebuilt, not re-parsed
    assert fast_downward.pddl2sas.cache_info().misses == translated  # nor its PDDL re-translated
    assert again.text == first.text
    assert again.privileged["admissible_commands"] == first.privileged["admissible_commands"]
    assert again.privileged["next_walkthrough_action"] == walkthrough[0]
    for action in walkthrough:
        r = env.step(action)
    assert r.done and r.reward == 1.0 and r.info["steps"] == len(walkthrough)
    other = env.reset(unseen[0])  # then a different game loads normally
    assert other.privileged["gamefile"].endswith(unseen[0].spec["gamefile"])
