"""ScienceWorld adapter on the real simulator (PyPI scienceworld, one JVM per env)."""

import time

import pytest

pytest.importorskip("scienceworld")
psutil = pytest.importorskip("psutil")

from jaxscaffold.envs.sciworld import (  # noqa: E402
    ScienceWorldEnv,
    ag_actions,
    catalogue,
    make_task,
    parse_goal_progress,
    task_names,
    variation_data,
)

# Different task types with short gold paths (variation 0 of the official train split).
GOLD_TASKS = [
    "find-animal",  # find / focus
    "lifespan-longest-lived",  # knowledge
    "identify-life-stages-2",  # biology
    "power-component",  # electricity
    "freeze",  # change of state
    "chemistry-mix",  # chemistry
    "use-thermometer",  # measurement
]


@pytest.fixture(scope="module")
def env():
    e = ScienceWorldEnv(step_limit=200)
    yield e
    pid = e.jvm_pid()
    e.close()
    if pid is not None:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _act(a: str) -> str:
    return f"<think>next step</think>\n<action>{a}</action>"


def test_catalogue_counts():
    names = task_names()
    assert len(names) == 30 and names[0] == "boil"
    assert len(catalogue("train", level="official")) == 3592
    assert len(catalogue("dev", level="official")) == 1796
    assert len(catalogue("test", level="official")) == 1819
    l0_test = catalogue("test", level="L0")
    assert len(l0_test) == 1661 and len(catalogue("train", level="L0")) == 3322
    assert len(catalogue("test", level="L1")) == 1684
    assert len(catalogue("train", level="L2")) == 2242 and len(catalogue("test", level="L2")) == 549
    # L0 test = official dev variations (SOURCE.md)
    data = variation_data()
    t = l0_test[0]
    assert t.spec["variation"] in data["tasks"][t.spec["task_name"]]["dev"]
    assert t.env == "sciworld" and t.split == "L0/test" and t.task_id == f"{t.spec['task_name']}/{t.spec['variation']}"
    sub = catalogue("train", level="official", tasks=["boil", 5])
    assert {x.spec["task_name"] for x in sub} == {"boil", names[5]}
    with pytest.raises(ValueError):
        catalogue("dev", level="L0")
    with pytest.raises(ValueError):
        catalogue("train", level="official", tasks=["no-such-task"])


def test_ag_and_goal_parsing():
    gold = ["open door to kitchen", "go to kitchen", "open door to hallway", "look around",
            "pick up thermometer"]
    assert ag_actions(gold) == ["go to kitchen", "open door to hallway", "look around"]
    text = ("Completed keys: \n----\nSequential Subgoals:\n----\n0\ttrue\t  GoalFind\tfocus on x\n"
            "----\nUnordered and Optional Subgoals:\n----\n0\tfalse\t  GoalIn\tbe near y\n----\n")
    g = parse_goal_progress(text)
    assert g["sequential"] == [{"index": 0, "done": True, "type": "GoalFind", "description": "focus on x"}]
    assert g["optional"][0]["done"] is False and g["optional"][0]["description"] == "be near y"


@pytest.mark.slow
def test_gold_paths_win(env):
    for name in GOLD_TASKS:
        obs = env.reset(make_task(name, 0, "train"))
        p = obs.privileged
        assert obs.text.startswith("Task: ") and "Action templates" in obs.text and "Objects:" in obs.text
        assert "valid_actions" not in p  # only on demand
        assert p["gold_actions"] and p["ag_actions"] == ag_actions(p["gold_actions"])
        assert p["goals"]["sequential"] and "Sequential Subgoals" in p["goal_progress"]
        r = None
        for a in p["gold_actions"]:
            r = env.step(_act(a))
            if r.done:
                break
        assert r is not None and r.done, name
        assert r.info["won"] is True and r.reward == 10.0 and r.info["score"] > 0, (name, r.info)
        assert r.info["failed"] is False and r.info["truncated"] is False
        assert any(g["done"] for g in r.observation.privileged["goals"]["sequential"])


def test_reset_observation_and_valid_actions_on_demand(env):
    obs = env.reset(make_task("find-animal", 1, "train"))
    assert "find" in obs.privileged["task_description"].lower()
    assert obs.privileged["task_name"] == "find-animal" and obs.privileged["variation"] == 1
    va = env.valid_actions()
    assert "look around" in va and len(va) > 10
    assert all(o in obs.text for o in obs.privileged["objects"][:3])
    assert len(obs.text) < 4000  # templates + objects, not every combination


def test_jvm_heap_bounded(env):
    env.reset(make_task("find-animal", 0, "train"))
    cmd = psutil.Process(env.jvm_pid()).cmdline()
    assert "-Xmx256m" in cmd and "-XX:+UseSerialGC" in cmd


def test_wrong_focus_is_failure_not_reward(env):
    env.reset(make_task("find-animal", 0, "train"))
    r = env.step(_act("focus on agent"))
    assert r.done and r.info["failed"] and not r.info["won"]
    assert r.info["score"] < 0 and r.reward == 0.0
    with pytest.raises(RuntimeError):
        env.step(_act("look around"))


def test_step_limit_and_invalid_actions():
    e = ScienceWorldEnv(step_limit=3)
    try:
        e.reset(make_task("find-animal", 0, "train"))
        r1 = e.step(_act("fly to the moon"))
        assert r1.info["invalid"] and not r1.done and r1.info["parse_error"] is None
        assert "No known action" in r1.observation.text
        r2 = e.step("no tags at all")
        assert r2.info["invalid"] and r2.info["parse_error"] and not r2.done
        assert "Invalid output" in r2.observation.text
        r3 = e.step(_act("look around"))
        assert r3.done and r3.info["truncated"] and not r3.info["won"] and r3.reward == 0.0
        assert not r3.info["invalid"] and r3.info["steps"] == 3
    finally:
        e.close()


def test_adversarial_outputs(env, tmp_path):
    marker = tmp_path / "pwned"
    env.reset(make_task("find-animal", 0, "train"))
    hostile = [
        f"<action>__import__('os').system('touch {marker}')</action>",
        f"<action>import os; os.system('touch {marker}')</action>",
        "<action>().__class__.__base__.__subclasses__()</action>",
        "<action>exec(\"open('/tmp/x','w')\")</action>",
        f"```python\nimport os\nos.system('touch {marker}')\n```",
        "<action>" + "A" * 1_000_000 + "</action>",
        "B" * 1_000_000,
        "<action><action>look</action",
        "<action>go to kitchen",
        "</action>look around<action>",
        "<action>\u202eecnahc\u202c \U0001F600 \u0000</action>",
        "<action>\uff4c\uff4f\uff4f\uff4b</action>",  # full-width letters: not an action
        "<action>${jndi:ldap://127.0.0.1/a}</action>",
        "<action>look around; reset task</action>",
    ]
    t = time.perf_counter()
    for text in hostile:
        r = env.step(text)
        assert r.info["invalid"] is True, text[:80]
        assert not r.done and r.reward == 0.0
    assert time.perf_counter() - t < 20
    assert not marker.exists()
    # the env is still usable, and a valid action at the end of a huge output still counts
    r = env.step("x" * 1_000_000 + "<action>look around</action>")
    assert not r.info["invalid"] and "This room is called" in r.observation.text
