"""tau2-bench adapter: gold replays scored by tau2's own evaluator, the user-simulator path,
untrusted output, the OE enricher."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

pytest.importorskip("tau2")

from jaxscaffold.envs import tau2 as T  # noqa: E402
from jaxscaffold.envs.base import EnvError  # noqa: E402
from jaxscaffold.envs.gold import GOLD_ENV_KWARGS, GoldPolicy  # noqa: E402
from jaxscaffold.feedback.enrichers import enricher  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLD_TASKS_PER_DOMAIN = 10
ALL = {t.task_id: t for t in T.catalogue("base")}


def _call(tool: str, /, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": tool, "arguments": arguments}) + "\n</tool_call>"


def _play_gold(env: T.Tau2Env, task) -> dict:
    obs = env.reset(task)
    policy = GoldPolicy("tau2", obs)
    for _ in range(200):
        r = env.step(policy.act(obs))
        obs = r.observation
        if r.done:
            return r.info
    raise AssertionError(f"{task.task_id}: the gold episode did not end")


def test_catalogue_splits():
    sizes = {s: len(T.catalogue(s)) for s in ("retail/train", "retail/test", "airline/train",
                                              "airline/test", "telecom/train", "telecom/test")}
    assert sizes == {"retail/train": 74, "retail/test": 40, "airline/train": 30,
                     "airline/test": 20, "telecom/train": 74, "telecom/test": 40}
    test = T.catalogue("test")
    assert len(test) == 100 and len({t.task_id for t in test}) == 100
    assert {t.spec["domain"] for t in test} == set(T.DOMAINS)
    assert not {t.task_id for t in test} & {t.task_id for t in T.catalogue("train")}
    assert all(t.env == "tau2" and t.task_id.startswith(t.spec["domain"] + "/") for t in test)
    assert all(t.spec["solo_capable"] == (t.spec["domain"] == "telecom") for t in test)
    with pytest.raises(ValueError, match="unknown tau2 split"):
        T.catalogue("validation")


@pytest.mark.parametrize("domain", T.DOMAINS)
def test_gold_actions_score_one(domain):
    """The gold tool calls (then the facts to communicate, then `done`), through the agent's
    text interface, score 1.0 with tau2's evaluator (retail / airline without a user, telecom
    in solo mode)."""
    tasks = T.catalogue(f"{domain}/test")[:GOLD_TASKS_PER_DOMAIN]
    env = T.Tau2Env(**GOLD_ENV_KWARGS["tau2"])
    infos = [_play_gold(env, t) for t in tasks]
    share = sum(i["won"] for i in infos) / len(infos)
    assert len(infos) == GOLD_TASKS_PER_DOMAIN and share == 1.0, \
        [(t.task_id, i["reward_info"]) for t, i in zip(tasks, infos) if not i["won"]]
    assert all(i["termination"] == "agent_stop" for i in infos)


def test_wrong_actions_score_zero():
    task = ALL["retail/0"]
    env = T.Tau2Env()
    env.reset(task)
    r = env.step(_call("get_order_details", order_id="#W2378156"))
    assert not r.done and "#W2378156" in r.observation.text
    r = env.step(_call("cancel_pending_order", order_id="#W2378156", reason="no longer needed"))
    assert r.observation.text.count("Error") == 1  # tau2's own answer: the order is delivered
    r = env.step(_call("done"))
    assert r.done and r.reward == 0.0 and r.info["won"] is False
    assert r.info["reward_info"]["db_match"] is False


# ------------------------------------------------------------------------- untrusted output

def _hash(env: T.Tau2Env) -> tuple:
    return env.environment.get_db_hash(), env.environment.get_user_db_hash()


def test_adversarial_outputs_execute_nothing(tmp_path):
    sentinel = tmp_path / "pwned"
    code = f"__import__('os').system('touch {sentinel}')"
    outputs = [
        f"<tool_call>{code}</tool_call>",
        f"<tool_call>\nimport os\nos.system('touch {sentinel}')\n</tool_call>",
        _call("__import__", name="os"),
        _call("system", command=f"touch {sentinel}"),
        _call("calculate", expression=code),
        _call("calculate", expression="9**9**9**9"),  # passes tau2's character check
        _call("calculate", expression="(" * 5000 + "1" + ")" * 5000),
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": </tool_call>',
        "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
        "<tool_call>" + json.dumps({"name": "get_user_details",
                                    "arguments": {"user_id": "x" * 2_000_000}}) + "</tool_call>",
        "<tool_call><tool_call>{}</tool_call></tool_call>",
        '<tool_call>{"name": "get_order_details.__globals__", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_order_details", "arguments": {"__class__": 1}}</tool_call>',
        '<tool_call>{"name": "get_order_details", "arguments": "not json"}</tool_call>',
        # a valid call next to an invalid one: neither runs
        _call("get_order_details", order_id="#W2378156") + _call("eval", source=code),
        "<tool_call></tool_call>",
    ]
    env = T.Tau2Env()
    env.reset(ALL["retail/0"])
    before, traj = _hash(env), env.trajectory
    for text in outputs:
        r = env.step(text)
        assert r.info["invalid"] is True and not r.done, text[:80]
        assert r.observation.text.startswith("Invalid tool call:"), r.observation.text[:200]
        assert "Nothing was executed" in r.observation.text
        assert len(r.observation.text) < 3000
    assert _hash(env) == before and env.trajectory == traj and not sentinel.exists()
    # Plain text (code included) is a message to the user: recorded, never run.
    r = env.step(code)
    assert not r.info["invalid"] and r.info["no_user"] and not sentinel.exists()
    assert _hash(env) == before and env.trajectory[-1].content == code


def test_calculate_runs_plain_arithmetic():
    env = T.Tau2Env()
    env.reset(ALL["retail/0"])
    r = env.step(_call("calculate", expression="(2 + 3) * 4 / 8"))
    assert r.observation.text == "<tool_response>\n2.5\n</tool_response>" and not r.info["invalid"]
    assert T.arithmetic_error("1+-2*(3/4)") is None
    for bad in ("2**8", "1//2", "x+1", "1 if 1 else 2", "'a'*9", "True+1", 7):
        assert T.arithmetic_error(bad), bad


def test_step_limit_and_finished_episode():
    env = T.Tau2Env(max_steps=2)
    env.reset(ALL["airline/0"])
    assert not env.step(_call("nope")).done
    r = env.step(_call("get_user_details", user_id="mia_li_3668"))
    assert r.done and r.info["termination"] == "max_steps" and r.reward == 0.0
    with pytest.raises(EnvError):
        env.step("hello")


# ------------------------------------------------------------------------ solo and user modes

def test_telecom_solo_mode():
    task = T.catalogue("telecom/test")[0]
    env = T.Tau2Env()
    obs = env.reset(task)
    assert obs.privileged["solo"] and obs.text.startswith("Ticket:")
    names = {t["function"]["name"] for t in obs.privileged["tools"]}
    assert {"toggle_airplane_mode", "get_customer_by_phone", "done"} <= names  # user tools too
    prompt = obs.system_prompt
    assert "<tools>" in prompt and "<ticket>" in prompt and "<policy>" in prompt
    r = env.step("I will now check the phone.")  # tau2: no text to a user in solo mode
    assert r.done and r.info["termination"] == "agent_error" and r.reward == 0.0
    with pytest.raises(EnvError, match="solo"):
        T.Tau2Env(solo=True).reset(ALL["retail/0"])


def test_scripted_user_retail_gold_wins():
    """Text goes to the user callable (tau2's user system prompt, roles flipped); the user's
    ###STOP### ends the episode; gold calls + the facts communicated score 1.0."""
    task = next(t for t in T.catalogue("retail/test")
                if T.load_task(t)[1].evaluation_criteria.communicate_info)
    seen = []

    def user(messages):
        seen.append(messages)
        if len(seen) == 1:
            return "Hi, I need help with my order."
        return "Great, thanks! ###STOP###"

    env = T.Tau2Env(user=user)
    obs = env.reset(task)
    assert obs.text == "Hi, I need help with my order." and not obs.privileged["solo"]
    system = seen[0][0]
    scenario = T.load_task(task)[1].user_scenario.instructions.reason_for_call
    assert system["role"] == "system" and scenario[:60] in system["content"]
    assert seen[0][1:] == [{"role": "user", "content": "Hi! How can I help you today?"}]
    policy = GoldPolicy("tau2", obs)
    while True:
        r = env.step(policy.act(obs))
        obs = r.observation
        if r.done:
            break
    assert r.info["termination"] == "user_stop" and r.info["won"], r.info
    facts = " ".join(T.load_task(task)[1].evaluation_criteria.communicate_info)
    assert seen[-1][-1] == {"role": "user", "content": facts}
    assert seen[-1][-2]["role"] == "assistant"  # the user's own earlier reply


def test_scripted_user_with_phone_tools_telecom_wins():
    """Telecom with a user: the user runs its phone tools through `<tool_call>` replies; the
    agent runs its own; the episode scores 1.0 in tau2's non-solo evaluation."""
    task = T.catalogue("telecom/test")[0]
    gold = T.load_task(task)[1].evaluation_criteria.actions
    pending: list = []

    def user(messages):
        last = messages[-1]["content"]
        if last.startswith("Please run "):
            pending.append(json.loads(last[len("Please run "):]))
        if pending:
            call = pending.pop()
            return _call(call["name"], **call["arguments"])
        if last.startswith("<tool_response>"):
            return "Done."
        if "fixed" in last:
            return "Yes, it works now. ###STOP###"
        return "My phone has a problem."

    env = T.Tau2Env(user=user)
    obs = env.reset(task)
    assert not obs.privileged["solo"] and obs.text == "My phone has a problem."
    assert "toggle_airplane_mode" not in {t["function"]["name"] for t in obs.privileged["tools"]}
    for a in gold:
        if a.requestor == "user":
            r = env.step("Please run " + json.dumps({"name": a.name, "arguments": a.arguments}))
            assert r.observation.text == "Done.", r.observation.text
        else:
            r = env.step(_call(a.name, **a.arguments))
        assert not r.done and not r.info["invalid"]
    r = env.step("Is it fixed now?")
    assert r.done and r.info["termination"] == "user_stop" and r.info["won"], r.info["reward_info"]
    traj = env.trajectory
    user_calls = [tc for m in traj if m.role == "user" and m.tool_calls for tc in m.tool_calls]
    assert len(user_calls) == sum(a.requestor == "user" for a in gold)
    assert all(tc.requestor == "user" for tc in user_calls)


def test_user_simulator_failures_are_env_errors():
    def broken(messages):
        raise TimeoutError("endpoint down")

    with pytest.raises(EnvError, match="endpoint down"):
        T.Tau2Env(user=broken).reset(ALL["retail/0"])
    with pytest.raises(EnvError, match="no text"):
        T.Tau2Env(user=lambda m: "").reset(ALL["retail/0"])


def test_chat_endpoint_user_over_loopback():
    got = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"choices": [{"message": {"role": "assistant",
                                                        "content": "I want a refund."}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        user = T.ChatEndpointUser(f"http://127.0.0.1:{server.server_port}/v1", model="m")
        obs = T.Tau2Env(user=user).reset(ALL["retail/1"])
    finally:
        server.shutdown()
    assert obs.text == "I want a refund."
    assert got[0]["model"] == "m" and got[0]["messages"][0]["role"] == "system"


# ---------------------------------------------------------------------------------- OE

def test_oe_enricher_shows_touched_records():
    enrich = enricher("tau2", {"oe": "db_state"})
    env = T.Tau2Env()
    obs = env.reset(ALL["retail/0"])
    assert enrich("oe", obs, 0, []) == obs.text  # nothing touched yet
    r = env.step(_call("find_user_id_by_name_zip", first_name="Yusuf", last_name="Rossi",
                       zip="19122"))
    r = env.step(_call("get_order_details", order_id="#W2378156"))
    text = enrich("oe", r.observation, 2, [])
    assert text.startswith(r.observation.text) and "[Current DB state]" in text
    assert "users yusuf_rossi_9620:" in text and "orders #W2378156:" in text
    assert '"status":"delivered"' in text
    r = env.step(_call("exchange_delivered_order_items", order_id="#W2378156",
                       item_ids=["1151293680", "4983901480"],
                       new_item_ids=["7706410293", "7747408585"],
                       payment_method_id="credit_card_9513926"))
    text = enrich("oe", r.observation, 3, [])
    assert '"status":"exchange requested"' in text  # the current record, after the write
    assert "users yusuf_rossi_9620:" in text
    assert len(text) < len(r.observation.text) + 6 * 700 + 200


def test_oe_enricher_telecom_phone():
    enrich = enricher("tau2")
    env = T.Tau2Env()
    task = T.catalogue("telecom/test")[0]
    obs = env.reset(task)
    assert '"airplane_mode":true' in enrich("oe", obs, 0, [])
    r = env.step(_call("toggle_airplane_mode"))
    assert '"airplane_mode":false' in enrich("oe", r.observation, 1, [])


# ------------------------------------------------------------------------------ launcher

def test_eval_gold_through_the_pool():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "eval.py"), "--env", "tau2",
                          "--split", "telecom/test", "--policy", "gold", "--limit", "6", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"env": "tau2", "split": "telecom/test", "episodes": 6, "failures": 0, "success_rate": 1.0}


def test_missing_extra_says_how_to_install():
    code = ("import sys; sys.modules['tau2'] = None\n"
            "from jaxscaffold.envs import registry\n"
            "try:\n    registry.catalogue('tau2', 'test')\n"
            "except registry.MissingEnvDependency as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert "needs tau2" in out.stdout and "pip install -e '.[tau2]'" in out.stdout, out
