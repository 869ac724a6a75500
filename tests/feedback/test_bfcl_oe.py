"""BFCL observation enhancement (FEE's OE): each per-class rule on real calls of the real
backends, the gold replay enriched like the agent (all 800 entries still win with OE on every
turn and the enriched texts compared), and the standard env unchanged when OE is off."""

from __future__ import annotations

import datetime
import json
import random

import pytest

pytest.importorskip("bfcl_eval")

from jaxscaffold.envs import bfcl as B  # noqa: E402
from jaxscaffold.envs.base import Observation  # noqa: E402
from jaxscaffold.feedback import bfcl_oe as O  # noqa: E402
from jaxscaffold.feedback import enrichers as E  # noqa: E402
from tests.envs.test_bfcl import ALL, UNWINNABLE, _method, _task, _turns  # noqa: E402

OE = E.enricher("bfcl")


def _env(**kwargs) -> B.BFCLEnv:
    """A BFCL env with feedback's hooks (OE computed in the env), as training builds it."""
    return B.BFCLEnv.from_kwargs(**{**E.env_kwargs()["bfcl"], **kwargs})


def _state(x, seen: dict | None = None):
    """An instance's whole state (private attributes and RNG included) as comparable data;
    file timestamps (wall-clock `datetime.now()` at creation) are left out."""
    seen = {} if seen is None else seen
    if isinstance(x, datetime.datetime):
        return "<timestamp>"
    if isinstance(x, random.Random):
        return x.getstate()
    if isinstance(x, (str, int, float, bool, type(None))):
        return x
    if id(x) in seen:  # shared or cyclic (a directory's parent): where it was first met
        return ("ref", seen[id(x)])
    seen[id(x)] = len(seen)
    if isinstance(x, dict):
        return [(k, _state(v, seen)) for k, v in x.items()]
    if isinstance(x, (list, tuple, set, frozenset)):
        return (type(x).__name__, [_state(v, seen) for v in x])
    return (type(x).__name__, _state(vars(x), seen))


def _step(env: B.BFCLEnv, calls: list[str]) -> list:
    """One tool step; the enriched outputs (JSON decoded) and a check of the plumbing."""
    r = env.step("[" + ", ".join(calls) + "]")
    obs, p = r.observation, r.observation.privileged
    assert not r.done and p["message_role"] == "tool"
    assert obs.text == "\n".join(f"{x['method']}: {x['raw_output']}" for x in p["tool_results"])
    assert p["oe_text"] == "\n".join(f"{x['method']}: {x['oe_output']}"
                                     for x in p["tool_results"])
    assert OE("oe", obs, 1, []) == p["oe_text"]  # what the feedback layer shows with OE on
    assert p["tool_oe_outputs"] == [x["oe_output"] for x in p["tool_results"]]
    return [json.loads(o) if o.startswith("{") else o for o in p["tool_oe_outputs"]]


# ------------------------------------------------------------------------- GorillaFileSystem

def test_file_system_rules():
    env = _env(tool_format="python")
    env.reset(_task("multi_turn_base_0"))
    ws, doc = "/workspace", "/workspace/document"
    pdfs = ["final_report.pdf", "previous_report.pdf"]
    out = _step(env, ["ls()", "cd(folder='document')", "mkdir(dir_name='temp')",
                      "touch(file_name='a.txt')", "echo(content='hi', file_name='a.txt')",
                      "echo(content='shown')", "cat(file_name='a.txt')"])
    # every dict result: the current absolute path; read-only calls get no listing
    assert out[0] == {"current_directory_content": ["document", "archive"], "_current_path": ws}
    # after a successful cd: the new directory's contents
    assert out[1] == {"current_working_directory": "document", "_current_path": doc,
                      "_directory_contents": pdfs}
    # None -> a success text, plus path and the listing after the change
    assert out[2] == {
        "observation": "Command 'mkdir' completed successfully.", "_current_path": doc,
        "_directory_contents": pdfs + ["temp"]}
    assert out[3] == {"observation": "Command 'touch' completed successfully.",
                      "_current_path": doc, "_directory_contents": pdfs + ["temp", "a.txt"]}
    assert out[4] == {"observation": "Command 'echo' completed successfully.",
                      "_current_path": doc, "_directory_contents": pdfs + ["temp", "a.txt"]}
    assert out[5] == {"terminal_output": "shown", "_current_path": doc,
                      "_directory_contents": pdfs + ["temp", "a.txt"]}
    assert out[6] == {"file_content": "hi", "_current_path": doc}
    out = _step(env, ["cp(source='a.txt', destination='b.txt')",
                      "mv(source='b.txt', destination='temp')", "rm(file_name='a.txt')",
                      "mkdir(dir_name='temp')", "mkdir(dir_name='empty')",
                      "rmdir(dir_name='empty')", "cd(folder='temp')", "cd(folder='..')",
                      "cd(folder='nowhere')"])
    assert out[0] == {"result": "'a.txt' copied to 'b.txt'", "_current_path": doc,
                      "_directory_contents": pdfs + ["temp", "a.txt", "b.txt"]}
    assert out[1] == {"result": "'b.txt' moved to 'temp/b.txt'", "_current_path": doc,
                      "_directory_contents": pdfs + ["temp", "a.txt"]}
    assert out[2] == {"result": "'a.txt' removed", "_current_path": doc,
                      "_directory_contents": pdfs + ["temp"]}
    # a failed change: the path, no listing
    assert out[3] == {"error": "mkdir: cannot create directory 'temp': File exists",
                      "_current_path": doc}
    assert out[5] == {"result": "'empty' removed", "_current_path": doc,
                      "_directory_contents": pdfs + ["temp"]}
    assert out[6] == {"current_working_directory": "temp", "_current_path": doc + "/temp",
                      "_directory_contents": ["b.txt"]}
    assert out[7] == {"_current_path": doc, "_directory_contents": pdfs + ["temp"]}  # cd ..
    assert out[8]["_current_path"] == doc and "_directory_contents" not in out[8]
    # the exact enriched text the agent is shown for mkdir (python tool format)
    env.reset(_task("multi_turn_base_0"))
    env.step("[cd(folder='document')]")
    r = env.step("[mkdir(dir_name='temp')]")
    assert r.observation.text == "mkdir: None"
    assert OE("oe", r.observation, 2, []) == (
        "mkdir: {\"observation\": \"Command 'mkdir' completed successfully.\", "
        "\"_current_path\": \"/workspace/document\", \"_directory_contents\": "
        "[\"final_report.pdf\", \"previous_report.pdf\", \"temp\"]}")


# ------------------------------------------------------------------------- VehicleControlAPI

def test_vehicle_rules():
    env = _env(tool_format="python")
    env.reset(_task("multi_turn_base_56"))  # all four doors unlocked, 10 gallons, engine off
    doors = ["driver", "passenger", "rear_left", "rear_right"]
    out = _step(env, ["startEngine(ignitionMode='START')",
                      f"lockDoors(unlock=False, door={doors})",
                      "lockDoors(unlock=True, door=['driver'])",
                      "lockDoors(unlock=False, door=['driver'])",
                      "pressBrakePedal(pedalPosition=0.5)", "startEngine(ignitionMode='START')"])
    # a failed start: the ignition diagnostic and the hint
    assert out[0] == {
        "error": "All doors must be locked before starting the engine. Here are the unlocked "
                 "doors: driver, passenger, rear_left, rear_right",
        "_ignition_diagnostic": {"all_doors_locked": False, "unlocked_doors": doors,
                                 "brake_pedal_position": 0.0, "fuel_gallons": 10.0,
                                 "battery_voltage": 12.6},
        "_ignition_hint": O.IGNITION_HINT}
    # lock / unlock: the door grid and the number of unlocked doors
    assert out[1] == {"lockStatus": "locked", "remainingUnlockedDoors": 0,
                      "_door_status": dict.fromkeys(doors, "locked"), "_unlocked_doors": 0}
    assert out[2] == {"lockStatus": "unlocked", "remainingUnlockedDoors": 1,
                      "_door_status": {**dict.fromkeys(doors, "locked"), "driver": "unlocked"},
                      "_unlocked_doors": 1}
    assert out[3]["_unlocked_doors"] == 0
    assert out[4] == {"brakePedalStatus": "pressed", "brakePedalForce": 500.0}  # no rule
    assert out[5]["error"] == "Must press the brake fully before starting the engine."
    assert out[5]["_ignition_diagnostic"] == {
        "all_doors_locked": True, "unlocked_doors": [], "brake_pedal_position": 0.5,
        "fuel_gallons": 10.0, "battery_voltage": 12.6}
    out = _step(env, ["pressBrakePedal(pedalPosition=1.0)", "startEngine(ignitionMode='START')",
                      "check_tire_pressure()", "fillFuelTank(fuelAmount=5.0)"])
    assert out[1] == {"engineState": "running", "fuelLevel": 10.0, "batteryVoltage": 12.6}
    # tire pressure: what "healthy" means
    assert out[2]["_tire_pressure_note"] == O.TIRE_NOTE and "30-35 psi" in O.TIRE_NOTE
    assert out[2]["healthy_tire_pressure"] is True
    assert out[3] == {"fuelLevel": 15.0}  # no reference rule for the other vehicle calls


# ------------------------------------------------------------------------- TradingBot

def test_trading_rules():
    env = _env(tool_format="python")
    env.reset(_task("multi_turn_base_100"))  # logged in, market closed, balance 10000
    clock_closed = {"_system_time": "10:30 AM", "_market_status": "Closed",
                    "_trading_hours": O.TRADING_HOURS, "_market_warning": O.MARKET_CLOSED}
    out = _step(env, ["get_current_time()",
                      "place_order(order_type='Buy', symbol='AAPL', price=250.0, amount=10)",
                      "update_market_status(current_time_str='10:30 AM')",
                      "place_order(order_type='Buy', symbol='AAPL', price=227.16, amount=10)",
                      "get_symbol_by_name(name='Initech')", "get_stock_info(symbol='XYZ')",
                      "get_symbol_by_name(name='Apple')",
                      "get_order_details(order_id=12345)", "get_order_details(order_id=12446)"])
    # time-sensitive calls: system time, market status, trading hours, closed warning
    assert out[0] == {"current_time": "10:30 AM", **clock_closed}
    # a placed order: market price, deviation (stale above 5%), total cost, remaining balance
    assert out[1] == {"order_id": 12446, "order_type": "Buy", "status": "Pending",
                      "price": 250.0, "amount": 10, **clock_closed, "_market_price": 227.16,
                      "_price_deviation_pct": 10.05, "_stale_price": True,
                      "_total_cost": 2500.0, "_remaining_balance": 7500.0}
    assert out[2] == {"status": "Open", "_system_time": "10:30 AM", "_market_status": "Open",
                      "_trading_hours": O.TRADING_HOURS}  # open: no warning
    assert out[3]["_price_deviation_pct"] == 0.0 and out[3]["_stale_price"] is False
    assert out[3]["_remaining_balance"] == 7728.4
    # a failed symbol lookup: browse by sector
    assert out[4] == {"symbol": "Stock not found", "_lookup_hint": O.SECTOR_HINT}
    assert out[5] == {"error": "Stock with symbol 'XYZ' not found.", "_lookup_hint": O.SECTOR_HINT}
    assert out[6] == {"symbol": "AAPL"}
    # order details: what the status means
    assert out[7]["status"] == "Completed"
    assert out[7]["_status_meaning"] == O.ORDER_STATUS["Completed"]
    assert out[8]["_status_meaning"] == O.ORDER_STATUS["Open"]
    # not logged in: how to log in
    out = _step(env, ["trading_logout()", "get_account_info()",
                      "place_order(order_type='Sell', symbol='AAPL', price=1.0, amount=1)"])
    assert out[1] == {"error": "User not authenticated. Please log in to view account "
                               "information.", "_login_hint": O.LOGIN_HINT}
    assert out[2]["_login_hint"] == O.LOGIN_HINT and "_market_price" not in out[2]


# ------------------------------------------------------------------------- TravelAPI

def test_travel_rules():
    env = _env(tool_format="python")
    env.reset(_task("multi_turn_base_150"))  # token abc123token (3600 uses), one 5000 card
    card, token = "1234-5678-9012-3456", "abc123token"
    trip = "travel_date='2024-11-15', travel_class='economy'"
    out = _step(env, [
        "verify_traveler_information(first_name='Evelyn', last_name='Montgomery', "
        "date_of_birth='1990-01-01', passport_number='X1234')",
        "verify_traveler_information(first_name='Evelyn', last_name='Montgomery', "
        "date_of_birth='1990-01-01', passport_number='US1234')",
        f"get_flight_cost(travel_from='SFO', travel_to='LAX', {trip})",
        f"book_flight(access_token='{token}', card_id='{card}', travel_from='San Francisco', "
        f"travel_to='LAX', {trip})",
        f"book_flight(access_token='{token}', card_id='{card}', travel_from='SFO', "
        f"travel_to='LAX', {trip})"])
    # a failed verification: the rules
    assert out[0] == {"verification_status": False,
                      "verification_failure": "Passport must be issued by the United States.",
                      "_verification_rules": O.TRAVELER_RULES}
    assert out[1] == {"verification_status": True}
    # flight cost: affordability against the best card and the budget limit
    assert out[2] == {"travel_cost_list": [400.0], "_affordability": {
        "cost": 400.0, "best_card": card, "best_card_balance": 5000.0,
        "within_card_balance": True, "budget_limit": 15400.0, "within_budget": True}}
    # a failed booking: the IATA-code hint, or a snapshot of the card balances
    assert out[3] == {"booking_status": False,
                      "error": "Invalid departure airport code: San Francisco",
                      "_token_calls_remaining": 3600, "_booking_hint": O.IATA_HINT}
    assert out[4] == {"booking_status": False, "error": "Balance is less than budget limit",
                      "_token_calls_remaining": 3600, "_card_balances": {card: 5000.0},
                      "_budget_limit": 15400.0}
    out = _step(env, [f"set_budget_limit(access_token='{token}', budget_limit=300.0)",
                      f"get_flight_cost(travel_from='SFO', travel_to='LAX', {trip})",
                      "authenticate_travel(client_id='c', client_secret='s', refresh_token='r', "
                      "grant_type='read_write', user_first_name='Evelyn', "
                      "user_last_name='Montgomery')",
                      f"get_credit_card_balance(access_token='wrong', card_id='{card}')"])
    assert out[0] == {"budget_limit": 300.0, "_token_calls_remaining": 3600}
    assert out[1]["_affordability"]["within_budget"] is False
    # with a token: the remaining uses, and a refresh hint at 1 or less
    assert out[2]["expires_in"] == 2 and out[2]["_token_calls_remaining"] == 2
    assert "_token_hint" not in out[2]
    assert out[3] == {"error": "Invalid access token", "_token_calls_remaining": 1,
                      "_token_hint": O.TOKEN_HINT}


# ------------------------------------------------------------------------- rule table

def test_rule_table_names_real_methods_and_rules_only_read_state():
    for class_name, rules in O.OE_RULES.items():
        for rule in rules:
            for m in rule.methods or ():
                assert not m.startswith("_") and callable(_method(m)), (class_name, m)
    import inspect
    token_methods = {m for m in O.TRAVEL_TOKEN_METHODS if m != "authenticate_travel"}
    assert token_methods == {d["name"] for d in B.func_docs(["TravelAPI"])
                             if "access_token" in d["parameters"]["properties"]}
    assert "access_token" in inspect.signature(_method("book_flight")).parameters
    # the same calls with and without OE leave identical instances (private state too)
    script = {
        "multi_turn_base_0": ["cd(folder='document')", "mkdir(dir_name='t')", "ls()",
                              "touch(file_name='x')", "mv(source='x', destination='t')"],
        "multi_turn_base_56": ["startEngine(ignitionMode='START')", "check_tire_pressure()",
                               "lockDoors(unlock=False, door=['driver'])"],
        "multi_turn_base_100": ["get_current_time()", "get_order_details(order_id=12345)",
                                "place_order(order_type='Buy', symbol='AAPL', price=1.0, "
                                "amount=1)", "trading_logout()", "get_account_info()"],
        "multi_turn_base_150": ["get_flight_cost(travel_from='SFO', travel_to='LAX', "
                                "travel_date='2024-11-15', travel_class='economy')",
                                "get_credit_card_balance(access_token='x', card_id='y')"],
    }
    for entry_id, calls in script.items():
        on, off = _env(tool_format="python"), _env(tool_format="python",
                                                             oe_transform=None)
        for env in (on, off):
            env.reset(_task(entry_id))
            env.step("[" + ", ".join(calls) + "]")
        for name in on.instances:
            assert _state(on.instances[name]) == _state(off.instances[name]), name


def test_enricher_leaves_user_messages_and_unenriched_outputs_alone():
    env = _env(tool_format="qwen")
    obs = env.reset(_task("multi_turn_base_0"))
    assert OE("oe", obs, 0, []) == obs.text and "oe_text" not in obs.privileged
    r = env.step('<tool_call>\n{"name": "post_tweet", "arguments": {"content": "hi"}}\n'
                 '</tool_call>')  # TwitterAPI: no rules
    assert OE("oe", r.observation, 1, []) == r.observation.text
    r = env.step('<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>')
    assert json.loads(OE("oe", r.observation, 2, [])) == {
        "current_working_directory": "/workspace", "_current_path": "/workspace"}
    assert E.bfcl_oe(Observation("text", {"message_role": "tool"}), []) == "text"


# ------------------------------------------------------------------------- gold replays

def _gold_episode(env: B.BFCLEnv, task, shown: list):
    """Plays the gold answers; `shown` gets what the agent would see with OE on every step."""
    entry, gold, per_turn = _turns(task)
    obs = env.reset(task)
    shown.append(OE("oe", obs, 0, []))
    r, step = None, 0
    for calls in per_turn:
        for action in (["[" + ", ".join(calls) + "]"] if calls else []) + ["All done."]:
            r = env.step(action)
            step += 1
            if not r.done:
                shown.append(OE("oe", r.observation, step, []))
    return r


def test_gold_replay_with_oe_on_every_turn_passes_the_checks():
    """All 800 entries, OE shown at every step and the enriched texts compared (agent vs the
    equally enriched gold replay): every winnable entry still wins, none by a rule failing."""
    errors = []

    def strict(*args):
        try:
            return O.enrich_result(*args)
        except Exception as e:  # the dispatcher would fall back silently; count it here
            errors.append((args[1], repr(e)))
            raise

    env = _env(tool_format="python", oe_transform=strict, response_check_on="oe")
    losers, enriched, gold_enriched = set(), 0, 0
    for task in ALL:
        shown = []
        r = _gold_episode(env, task, shown)
        if r.reward != 1.0:
            losers.add(task.task_id)
        enriched += sum("\"_" in s or "completed successfully" in s for s in shown)
        gold_enriched += sum(g.oe_output != g.output for turn in env._gold_records for g in turn)
    assert not errors, errors[:5]
    assert losers == UNWINNABLE
    assert enriched > 1000 and gold_enriched > 1000  # OE really ran, on both sides


def test_oe_check_compares_enriched_with_enriched():
    """Reordered but equivalent calls: the plain results still match the gold's, the enriched
    ones do not (listings taken mid-way differ), so `response_check_on="oe"` is stricter."""
    task = _task("multi_turn_base_39")
    _, _, per_turn = _turns(task)
    turn = per_turn[1]
    assert [c.split("(")[0] for c in turn] == ["cd"] + ["touch", "echo"] * 3
    reordered = [turn[0], turn[1], turn[3], turn[5], turn[2], turn[4], turn[6]]
    verdicts = {}
    for on in ("transformed", "oe"):
        env = _env(tool_format="python", response_check_on=on)
        env.reset(task)
        for t, calls in enumerate(per_turn):
            env.step("[" + ", ".join(reordered if t == 1 else calls) + "]")
            r = env.step("done")
            if t == 1:
                verdicts[on] = r.info["turn_check"]
    assert verdicts["transformed"]["valid"]
    assert verdicts["oe"]["error_type"] == "multi_turn:execution_response_mismatch"


def test_oe_off_is_the_standard_env():
    """The standard env (no schedule: the agent sees `obs.text`) is unchanged: its texts are
    BFCL's raw strings, and an env without `oe_transform` gives the same texts, rewards,
    checks and backend states (only the OE keys of `privileged` are new)."""
    extra = ["[pwd(), ls(), mkdir(dir_name='x'), startEngine(ignitionMode='START')]",
             "[get_flight_cost(travel_from='SFO', travel_to='LAX', travel_date='2024-11-15', "
             "travel_class='economy'), trading_logout(), get_account_info(), nope()]"]
    on, off = _env(tool_format="python"), _env(tool_format="python", oe_transform=None)

    def strip(p: dict) -> dict:
        p = {k: v for k, v in p.items() if k not in ("oe_text", "tool_oe_outputs")}
        p["tool_results"] = [{k: v for k, v in x.items() if k != "oe_output"}
                             for x in p["tool_results"]]
        return p

    for n, task in enumerate(ALL):
        _, _, per_turn = _turns(task)
        a, b = on.reset(task), off.reset(task)
        assert a.text == b.text and strip(a.privileged) == strip(b.privileged)
        for t, calls in enumerate(per_turn):
            actions = ([extra[n % 2]] if t == n % 3 else []) + (
                ["[" + ", ".join(calls) + "]"] if calls else []) + ["All done."]
            for action in actions:
                x, y = on.step(action), off.step(action)
                assert x.observation.text == y.observation.text
                assert strip(x.observation.privileged) == strip(y.observation.privileged)
                assert (x.reward, x.done, x.info) == (y.reward, y.done, y.info)
                p = x.observation.privileged
                if p["message_role"] == "tool" and not x.done:
                    assert x.observation.text == "\n".join(
                        f"{r['method']}: {r['raw_output']}" for r in p["tool_results"])
                    assert y.observation.privileged["oe_text"] == y.observation.text
        for name in on.instances:
            assert _state(on.instances[name]) == _state(off.instances[name])


def test_oe_text_crosses_the_pool_process_boundary():
    from jaxscaffold.envs.pool import EnvPool
    with EnvPool(1, env_kwargs=E.env_kwargs({"bfcl": {"tool_format": "python"}})) as pool:
        pool.reset([_task("multi_turn_base_0")])
        r = pool.step({0: "[cd(folder='document')]"})[0]
    assert r.observation.text == 'cd: {"current_working_directory": "document"}'
    assert json.loads(OE("oe", r.observation, 1, []).split(": ", 1)[1]) == {
        "current_working_directory": "document", "_current_path": "/workspace/document",
        "_directory_contents": ["final_report.pdf", "previous_report.pdf"]}
