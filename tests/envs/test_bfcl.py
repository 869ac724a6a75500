"""BFCL v3 multi-turn adapter: gold replays vs bfcl-eval's own checker, safety, isolation."""

from __future__ import annotations

import ast
import copy
import inspect
import json
import random

import pytest

pytest.importorskip("bfcl_eval")

from jaxscaffold.envs import bfcl as B  # noqa: E402
from jaxscaffold.envs.base import EnvError, Task  # noqa: E402
from jaxscaffold.envs.bfcl_calls import parse_python_calls, parse_qwen_calls  # noqa: E402

ALL = B.catalogue("train") + B.catalogue("validation")
UNWINNABLE = {"multi_turn_base_154"}  # 5 user turns, 6 gold turns: BFCL fails it too


def _task(entry_id: str) -> Task:
    for t in ALL:
        if t.task_id == entry_id:
            return t
    raise KeyError(entry_id)


def _turns(task: Task) -> tuple[dict, list, list[list[str]]]:
    entry, gold = B.load_entry(task.spec["category"], task.spec["index"])
    return entry, gold, [list(g) for g in gold[: len(entry["question"])]]


def _play(env: B.BFCLEnv, task: Task, per_turn: list[list[str]], fmt: str = "python"):
    """Per turn: one step with the calls (if any), then a plain reply ending the turn."""
    env.reset(task)
    r = None
    for calls in per_turn:
        if calls:
            r = env.step(_render(calls, fmt))
            assert not r.done, r.info
        r = env.step("All done.")
    assert r.done
    return r


def _render(calls: list[str], fmt: str) -> str:
    if fmt == "python":
        return "[" + ", ".join(calls) + "]"
    blocks = []
    for s in calls:  # gold strings -> Qwen3 JSON tool calls (positional args bound to names)
        node = ast.parse(s, mode="eval").body
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        if node.args:
            method = _method(node.func.id)
            names = [p for p in inspect.signature(method).parameters if p != "self"]
            kwargs.update(zip(names, (ast.literal_eval(a) for a in node.args)))
        blocks.append("<tool_call>\n" + json.dumps({"name": node.func.id, "arguments": kwargs})
                      + "\n</tool_call>")
    return "<think>\nI will call the tools.\n</think>\n\n" + "\n".join(blocks)


def _method(name: str):
    import importlib
    for cls_name, mod in B.CLASS_MODULES.items():
        cls = getattr(importlib.import_module(f"{B._BACKEND_PKG}.{mod}"), cls_name)
        if hasattr(cls, name) and not name.startswith("_"):
            return getattr(cls, name)
    raise KeyError(name)


def _bfcl_valid(entry: dict, gold: list, per_turn: list[list[str]], tag: str) -> bool:
    """bfcl-eval's own verdict (its runner's turn-count check, then `multi_turn_checker`) on
    the same responses: one decoded step per turn with calls, none otherwise. Its executor
    `eval`s these dataset strings; fine here (trusted gold text, test only)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
    if len(per_turn) != len(gold):
        return False  # multi_turn_runner: "multi_turn:force_terminated"
    decoded = [[calls] if calls else [] for calls in per_turn]
    e = copy.deepcopy(entry)
    return multi_turn_checker(decoded, gold, e, e["id"].rsplit("_", 1)[0], tag)["valid"]


# ------------------------------------------------------------------------------ catalogue

def test_catalogue_splits_and_cross_domain():
    train, val = B.catalogue("train"), B.catalogue("validation")
    assert len(train) == len(val) == 400
    assert {t.spec["index"] for t in train} == set(range(100))
    assert {t.spec["index"] for t in val} == set(range(100, 200))
    assert {t.spec["category"] for t in train} == set(B.CATEGORIES)
    assert len({t.task_id for t in ALL}) == 800 and all(t.env == "bfcl" for t in ALL)
    xtrain = B.catalogue("train", cross_domain=True)
    xval = B.catalogue("validation", cross_domain=True)
    assert all(set(t.spec["domain"]) <= set(B.TRAIN_DOMAIN) and t.spec["domain"] for t in xtrain)
    assert all(set(t.spec["domain"]) <= set(B.VALIDATION_DOMAIN) and t.spec["domain"]
               for t in xval)
    assert len(xtrain) == len(xval) == 400  # v3's id split is already cross-domain
    assert len(B.catalogue("train", categories=("base",))) == 100
    with pytest.raises(ValueError):
        B.catalogue("test")


# ------------------------------------------------------------------------------ gold replays

def test_all_800_gold_answers_win_and_agree_with_bfcl_checker():
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    disagreements, losers = [], set()
    for task in ALL:
        entry, gold, per_turn = _turns(task)
        r = _play(env, task, per_turn)
        ref = _bfcl_valid(entry, gold, per_turn, "jaxscaffold_ref_gold")
        if (r.reward == 1.0) != ref:
            disagreements.append((task.task_id, r.info.get("failure_message"), ref))
        if r.reward != 1.0:
            losers.add(task.task_id)
    assert not disagreements, disagreements
    assert losers == UNWINNABLE


def test_gold_replay_qwen_format_all_categories():
    env = B.BFCLEnv(B.BFCLOptions(tool_format="qwen"))
    for task in ALL:
        _, _, per_turn = _turns(task)
        r = _play(env, task, per_turn, fmt="qwen")
        assert r.reward == (0.0 if task.task_id in UNWINNABLE else 1.0), (task.task_id, r.info)


def test_perturbed_answers_agree_with_bfcl_checker():
    """Wrong answers are scored as bfcl-eval scores them (not only the gold ones)."""
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    rng = random.Random(0)
    disagreements, outcomes = [], {}
    for kind in ("drop_one_call", "repeat_a_turn", "merge_into_previous_turn"):
        wins = 0
        for task in ALL[::2]:
            entry, gold, per_turn = _turns(task)
            nonempty = [i for i, c in enumerate(per_turn) if c and (i > 0 or kind[0] != "m")]
            if not nonempty:
                continue
            i = rng.choice(nonempty)
            if kind == "drop_one_call":
                per_turn[i].pop(rng.randrange(len(per_turn[i])))
            elif kind == "repeat_a_turn":
                per_turn[i] = per_turn[i] + per_turn[i]
            else:
                per_turn[i - 1], per_turn[i] = per_turn[i - 1] + per_turn[i], []
            r = _play(env, task, per_turn)
            ref = _bfcl_valid(entry, gold, per_turn, f"jaxscaffold_ref_{kind}")
            wins += r.reward == 1.0
            if (r.reward == 1.0) != ref:
                disagreements.append((kind, task.task_id, r.reward, ref))
        outcomes[kind] = wins
    assert not disagreements, disagreements
    assert outcomes["drop_one_call"] < 10 and outcomes["repeat_a_turn"] > 100, outcomes


def test_empty_gold_turns_follow_bfcl():
    """miss_param / miss_func turns with an empty gold list are not checked (BFCL's
    irrelevance check is off): a call there does not fail by itself, only via later state."""
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    for entry_id in ("multi_turn_miss_param_0", "multi_turn_miss_func_0"):
        task = _task(entry_id)
        entry, gold, per_turn = _turns(task)
        empty = [i for i, c in enumerate(per_turn) if not c]
        assert empty
        # a harmless read-only call in the empty turn: still a win, for both
        probe = copy.deepcopy(per_turn)
        probe[empty[0]] = ["pwd()"]
        r = _play(env, task, probe)
        assert r.reward == 1.0 and _bfcl_valid(entry, gold, probe, "jaxscaffold_ref_pwd")
        checks = r.info["turn_checks"]
        assert checks[empty[0]] == {"turn": empty[0], "valid": True, "checked": False}
        # doing the next turn's work early, in the empty turn: a loss, for both
        early = copy.deepcopy(per_turn)
        early[empty[0]], early[empty[0] + 1] = per_turn[empty[0] + 1], []
        r = _play(env, task, early)
        assert r.reward == 0.0
        assert not _bfcl_valid(entry, gold, early, "jaxscaffold_ref_early")


def test_response_scope_turn_is_stricter_than_cumulative():
    """A turn's gold result obtained in an earlier turn counts for BFCL (cumulative)."""
    task = _task("multi_turn_base_0")
    entry, gold, per_turn = _turns(task)
    assert per_turn[2] == ["sort('final_report.pdf')"]  # read-only: no state change
    early = copy.deepcopy(per_turn)
    early[1] = per_turn[1] + per_turn[2]
    early[2] = ["pwd()"]
    assert _play(B.BFCLEnv(B.BFCLOptions(tool_format="python")), task, early).reward == 1.0
    assert _bfcl_valid(entry, gold, early, "jaxscaffold_ref_scope")
    r = _play(B.BFCLEnv(B.BFCLOptions(tool_format="python", response_scope="turn")), task, early)
    assert r.reward == 0.0 and r.info["failure"] == "multi_turn:execution_response_mismatch"


# ------------------------------------------------------------------------------ episode flow

def test_turn_flow_observations_and_privileged():
    env = B.BFCLEnv(B.BFCLOptions(tool_format="qwen"))
    task = _task("multi_turn_base_0")
    entry, gold, _ = _turns(task)
    obs = env.reset(task)
    p = obs.privileged
    assert obs.text == entry["question"][0][0]["content"]
    assert p["turn"] == 0 and p["gold_calls"] == gold[0] and p["gold_calls_all"] == gold
    assert p["message_role"] == "user" and "<tools>" in obs.system_prompt
    names = {t["function"]["name"] for t in p["tools"]}
    assert {"cd", "mkdir", "post_tweet"} <= names
    assert all(t["function"]["parameters"]["type"] == "object" for t in p["tools"])
    assert "<tools>" not in p["instructions"]
    r = env.step('<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call>'
                 '\n<tool_call>\n{"name": "mkdir", "arguments": {"dir_name": "temp"}}\n'
                 '</tool_call>')
    assert not r.done and r.info["tool_step"] and not r.info["invalid"]
    tr = r.observation.privileged["tool_results"]
    assert [x["method"] for x in tr] == ["cd", "mkdir"] and tr[0]["class"] == "GorillaFileSystem"
    assert tr[0]["kwargs"] == {"folder": "document"}
    assert r.observation.privileged["message_role"] == "tool"
    assert r.observation.privileged["tool_outputs"] == [x["output"] for x in tr]
    assert env.instances["GorillaFileSystem"].pwd() == {"current_working_directory":
                                                        "/workspace/document"}
    r = env.step("I moved into the document folder.")
    assert r.info["turn_ended"] and not r.done and r.reward == 0.0
    assert r.observation.text == entry["question"][1][0]["content"]
    assert r.observation.privileged["turn"] == 1
    assert r.info["turn_check"]["valid"] is False  # mv missing: state differs
    with pytest.raises(EnvError):
        env.close() or env.step("x")


def test_miss_func_reveal_and_hidden_function_modes():
    task = _task("multi_turn_miss_func_0")
    entry, gold, per_turn = _turns(task)
    assert entry["missed_function"] == {"3": ["sort"]}
    for mode in ("execute", "reject"):
        env = B.BFCLEnv(B.BFCLOptions(tool_format="python", hidden_functions=mode))
        obs = env.reset(task)
        assert "sort" not in {d["name"] for d in env.func_docs}
        assert '"name": "sort"' not in obs.system_prompt
        r = env.step("[sort(file_name='final_report.pdf')]")  # before its turn
        assert r.info["invalid"] == (mode == "reject")
        for t in range(3):
            if per_turn[t]:
                env.step("[" + ", ".join(per_turn[t]) + "]")
            r = env.step("done")
        obs = r.observation
        assert obs.privileged["turn"] == 3 and obs.privileged["revealed_functions"] == ["sort"]
        assert '"name": "sort"' in obs.text and '"name": "sort"' in obs.system_prompt
        assert "sort" in {d["name"] for d in env.func_docs}
        r = env.step("[sort(file_name='final_report.pdf')]")
        assert not r.info["invalid"]


def test_force_quit_after_20_tool_steps_in_a_turn():
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    env.reset(_task("multi_turn_base_0"))
    for _ in range(20):
        r = env.step("[pwd()]")
        assert not r.done
    r = env.step("[pwd()]")
    assert r.done and r.reward == 0.0 and r.info["failure"] == "force_quit"


def test_max_total_steps_and_stop_on_failed_turn():
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python", max_total_steps=3))
    env.reset(_task("multi_turn_base_0"))
    env.step("[pwd()]")
    env.step("hi")
    r = env.step("[pwd()]")
    assert r.done and r.info["failure"] == "truncated" and r.reward == 0.0
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python", stop_on_failed_turn=True))
    env.reset(_task("multi_turn_base_0"))
    r = env.step("nothing to do")  # turn 0 has gold calls: fails at once
    assert r.done and r.reward == 0.0
    assert r.info["failure"] == "multi_turn:empty_turn_model_response"


# ------------------------------------------------------------------------------ transform hook

def _fs_transform(instance, method, kwargs, result):
    """A feedback-style enrichment: None -> message; dict results get the current path."""
    if type(instance).__name__ != "GorillaFileSystem":
        return result
    if result is None:
        result = {"observation": f"Command '{method}' completed successfully."}
    if isinstance(result, dict):
        result["_cwd"] = instance.pwd()["current_working_directory"]
        result["_args"] = sorted(kwargs)
    return result


def test_result_transform_applies_to_agent_and_gold_and_cannot_touch_state():
    task = _task("multi_turn_base_0")
    _, _, per_turn = _turns(task)
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python",
                                  result_transform="tests.envs.test_bfcl:_fs_transform"))
    env.reset(task)
    r = env.step("[cd(folder='document'), mkdir(dir_name='temp')]")
    outs = r.observation.privileged["tool_results"]
    assert json.loads(outs[0]["output"])["_cwd"] == "/workspace/document"
    assert outs[1]["raw_output"] == "None"
    assert json.loads(outs[1]["output"])["observation"].startswith("Command 'mkdir'")
    assert "_cwd" not in outs[0]["raw_output"]
    # the transform mutates its result; the backend state and the stored result are intact
    assert "_cwd" not in outs[0]["result"]
    assert env.instances["GorillaFileSystem"].pwd() == {"current_working_directory":
                                                        "/workspace/document"}
    # gold replay is transformed the same way: the gold run still wins, on both check modes
    for on in ("transformed", "raw"):
        env = B.BFCLEnv(B.BFCLOptions(tool_format="python", result_transform=_fs_transform,
                                      response_check_on=on))
        assert _play(env, task, per_turn).reward == 1.0


def _raising_transform(instance, method, kwargs, result):
    raise RuntimeError("broken enrichment")


def test_oe_transform_stacks_on_result_transform_and_never_breaks_a_step():
    task = _task("multi_turn_base_0")
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python", result_transform=_fs_transform,
                                  oe_transform="jaxscaffold.feedback.bfcl_oe:enrich_result"))
    env.reset(task)
    r = env.step("[cd(folder='document')]")
    rec = r.observation.privileged["tool_results"][0]
    assert set(json.loads(rec["output"])) == {"current_working_directory", "_cwd", "_args"}
    assert set(json.loads(rec["oe_output"])) == {"current_working_directory", "_cwd", "_args",
                                                 "_current_path", "_directory_contents"}
    assert r.observation.text == f"cd: {rec['output']}"
    # a failing enrichment: the plain text stands in, the episode goes on and still wins
    _, _, per_turn = _turns(task)
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python", oe_transform=_raising_transform,
                                  response_check_on="oe"))
    env.reset(task)
    r = env.step("[cd(folder='document')]")
    assert r.observation.privileged["oe_text"] == r.observation.text
    assert _play(env, task, per_turn).reward == 1.0
    with pytest.raises(ValueError):
        B.BFCLEnv(B.BFCLOptions(response_check_on="enriched"))


def test_state_probe_reaches_privileged():
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python", state_probe=lambda inst: sorted(inst)))
    obs = env.reset(_task("multi_turn_base_0"))
    assert obs.privileged["probe"] == ["GorillaFileSystem", "TwitterAPI"]


# ------------------------------------------------------------------------------ isolation

def test_parallel_rollouts_of_one_entry_do_not_share_state():
    task = _task("multi_turn_base_0")
    a, b = B.BFCLEnv(B.BFCLOptions(tool_format="python")), B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    a.reset(task)
    b.reset(task)
    a.step("[cd(folder='document'), mkdir(dir_name='only_in_a'), touch(file_name='x.txt')]")
    assert a.instances["GorillaFileSystem"] is not b.instances["GorillaFileSystem"]
    r = b.step("[cd(folder='document'), ls()]")
    assert "only_in_a" not in r.observation.text and "x.txt" not in r.observation.text
    assert b.instances["GorillaFileSystem"] != a.instances["GorillaFileSystem"]
    # agent and gold instances are separate too
    assert a.instances["GorillaFileSystem"] is not a.gold_instances["GorillaFileSystem"]
    # interleaved full gold rollouts of the same entry both win
    _, _, per_turn = _turns(task)
    a.reset(task)
    b.reset(task)
    for calls in per_turn:
        for env in (a, b):
            if calls:
                env.step("[" + ", ".join(calls) + "]")
        ra, rb = a.step("ok"), b.step("ok")
    assert ra.reward == rb.reward == 1.0


def test_long_context_state_does_not_leak_through_module_globals():
    """TravelAPI's long_context merges module-level card dicts into its state by reference;
    the env's instances are deep copies, so spending on one never reaches another rollout."""
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code import long_context
    task = next(t for t in ALL if t.spec["category"] == "long_context"
                and "TravelAPI" in t.spec["involved_classes"])
    before = copy.deepcopy(long_context.CREDIT_CARD_EXTENSION)
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    env.reset(task)
    travel = env.instances["TravelAPI"]
    card_id = next(iter(long_context.CREDIT_CARD_EXTENSION))
    assert travel.credit_card_list[card_id] is not long_context.CREDIT_CARD_EXTENSION[card_id]
    travel.credit_card_list[card_id]["balance"] = -1.0
    assert long_context.CREDIT_CARD_EXTENSION == before
    other = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    other.reset(task)
    assert other.instances["TravelAPI"].credit_card_list[card_id] == before[card_id]


# ------------------------------------------------------------------------------ adversarial

ADVERSARIAL_PYTHON = [
    "__import__('os').system('touch {sentinel}')",
    "[__import__('os').system('touch {sentinel}')]",
    "import os; os.system('touch {sentinel}')",
    "().__class__.__bases__[0].__subclasses__()",
    "[ls(), ().__class__.__bases__[0].__subclasses__()]",
    "[_load_scenario({{}})]",
    "[__init__()]",
    "[ls.__globals__['subprocess'].run('touch {sentinel}', shell=True)]",
    "[echo(content=open('{sentinel}', 'w'), file_name='a')]",
    "[echo(content=__import__('os').system('touch {sentinel}'))]",
    "[cd(folder=(lambda: 1)())]",
    "[cd(**{{'folder': 'x'}})]",
    "[cd(*['x'])]",
    "[cd(folder=[i for i in range(3)])]",
    "[eval(\"__import__('os').system('touch {sentinel}')\")]",
    "[exec('import os')]",
    "[post_tweet(content=x)]",
    "[book_flight(access_token='t')]",  # TravelAPI is not involved in this entry
    "[ls(a=1"
]


@pytest.fixture
def fs_env():
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    env.reset(_task("multi_turn_base_0"))
    return env


@pytest.mark.parametrize("payload", ADVERSARIAL_PYTHON)
def test_adversarial_python_calls_are_rejected_and_never_run(fs_env, payload, tmp_path):
    sentinel = tmp_path / "pwned"
    before = copy.deepcopy(vars(fs_env.instances["GorillaFileSystem"]))
    r = fs_env.step(payload.format(sentinel=sentinel))
    assert not sentinel.exists()
    assert r.info["invalid"] and not r.done and r.info["tool_step"]
    rejected = [x for x in r.observation.privileged["tool_results"] if x["invalid"]]
    assert rejected and all(x["output"].startswith("Invalid function call:") for x in rejected)
    assert "Nothing was executed" in r.observation.text
    if "ls()" not in payload:
        assert vars(fs_env.instances["GorillaFileSystem"]).keys() == before.keys()
    # the env still works afterwards
    r = fs_env.step("[pwd()]")
    assert not r.info["invalid"] and "/workspace" in r.observation.text


ADVERSARIAL_QWEN = [
    '<tool_call>\n{"name": "__import__(\'os\').system", "arguments": {"command": "x"}}\n'
    '</tool_call>',
    '<tool_call>\n{"name": "_load_scenario", "arguments": {"scenario": {}}}\n</tool_call>',
    '<tool_call>\n{"name": "__init__", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "book_flight", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "cd", "arguments": {"__class__": 1}}\n</tool_call>',
    '<tool_call>\n{"name": "cd", "arguments": ["document"]}\n</tool_call>',
    "<tool_call>\nprint('hi')\n</tool_call>",
    '<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n',  # unterminated
    '<tool_call><tool_call>{"name": "cd", "arguments": {}}</tool_call></tool_call>',  # nested
    '</tool_call>',
    '<tool_call>\n{"name": "c\u0064\u200b", "arguments": {}}\n</tool_call>',  # zero-width
    '<tool_call>\n{"name": "ｃｄ", "arguments": {"folder": "document"}}\n</tool_call>',  # fullwidth
    '<tool_call>\n' + '[' * 100000 + ']' * 100000 + '\n</tool_call>',
]


@pytest.mark.parametrize("payload", ADVERSARIAL_QWEN)
def test_adversarial_qwen_calls_are_rejected(payload):
    env = B.BFCLEnv(B.BFCLOptions(tool_format="qwen", max_action_chars=1_000_000))
    env.reset(_task("multi_turn_base_0"))
    r = env.step(payload)
    assert r.info["invalid"] and not r.done
    assert "Invalid function call:" in r.observation.text
    r = env.step('<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>')
    assert not r.info["invalid"] and "/workspace" in r.observation.text


def test_huge_outputs_and_odd_unicode(fs_env):
    huge = "[echo(content='" + "A" * (1 << 20) + "', file_name='big.txt')]"
    r = fs_env.step(huge)  # over max_action_chars: rejected unparsed
    assert r.info["invalid"] and "too long" in r.observation.text
    assert "big.txt" not in str(fs_env.instances["GorillaFileSystem"].ls())
    big_env = B.BFCLEnv(B.BFCLOptions(tool_format="python", max_action_chars=2 << 20))
    big_env.reset(_task("multi_turn_base_0"))
    r = big_env.step(huge)  # within a raised limit: a literal, executed normally
    assert not r.info["invalid"]
    assert big_env.instances["GorillaFileSystem"].cat(file_name="big.txt")["file_content"] \
        == "A" * (1 << 20)
    deep = "[cd(folder=" + "[" * 50000 + "]" * 50000 + ")]"
    r = big_env.step(deep)
    assert r.info["invalid"]
    r = big_env.step("[touch(file_name='ünï\u200bcødé 🚀.txt')]")
    assert not r.info["invalid"]
    listing = big_env.instances["GorillaFileSystem"].ls()["current_directory_content"]
    assert "ünï\u200bcødé 🚀.txt" in listing
    r = big_env.step("[ｌｓ()]")  # fullwidth identifier (NFKC-normalises to 'ls' in Python)
    assert r.info["turn"] == 0  # whatever it resolves to, it was parsed, never eval'd


def test_non_call_text_ends_the_turn():
    for fmt, text in (("python", "I have finished moving the file."), ("python", "ok"),
                      ("qwen", "Done, no more calls needed."),
                      ("qwen", "<think>maybe <tool_call> later</think>All done.")):
        env = B.BFCLEnv(B.BFCLOptions(tool_format=fmt))
        env.reset(_task("multi_turn_base_0"))
        r = env.step(text)
        assert r.info["turn_ended"] and r.observation.privileged["turn"] == 1


@pytest.mark.parametrize("reasoning", ["<think>\nI will echo it.\n</think>\n\n", "I will echo it.\n</think>\n\n"])
def test_a_closing_think_tag_inside_an_argument_stays_in_the_call(reasoning):
    """Reasoning is a prefix that ends at the first </think>: a later one is the answer's
    (the parser used to cut at the last one, splitting the call)."""
    py = parse_python_calls(reasoning + "[echo(content='a </think> b'), cd(folder='x')]")
    assert [(c.name, c.kwargs, c.error) for c in py] == [("echo", {"content": "a </think> b"}, None),
                                                         ("cd", {"folder": "x"}, None)]
    block = json.dumps({"name": "echo", "arguments": {"content": "</think> done"}})
    q = parse_qwen_calls(f"{reasoning}<tool_call>{block}</tool_call>")
    assert [(c.name, c.kwargs, c.error) for c in q] == [("echo", {"content": "</think> done"}, None)]
    assert parse_python_calls(reasoning + "All done, </think> was only a word.") is None  # a reply


def test_parsers_unit():
    calls = parse_python_calls(
        "```python\n[cd(folder='a'), sort('f.txt'), f(x=-1.5, y=[1, {'k': (2,)}])]\n```")
    assert [(c.name, c.args, c.kwargs, c.error) for c in calls] == [
        ("cd", (), {"folder": "a"}, None), ("sort", ("f.txt",), {}, None),
        ("f", (), {"x": -1.5, "y": [1, {"k": (2,)}]}, None)]
    assert parse_python_calls("Sure, done.") is None
    assert parse_python_calls("cd(folder=x)")[0].error
    assert parse_python_calls("[a.b()]")[0].error
    assert parse_python_calls("[f(x=1+2)]")[0].error
    q = parse_qwen_calls('<tool_call>{"name": "cd", "arguments": "{\\"folder\\": \\"a\\"}"}'
                         '</tool_call>')
    assert q[0].kwargs == {"folder": "a"} and q[0].error is None
    assert parse_qwen_calls("no calls here") is None


def test_no_eval_exec_or_shell_is_ever_reached(monkeypatch, tmp_path):
    """Every adversarial payload, with eval / exec / os.system / subprocess booby-trapped.
    (`compile` stays: `ast.parse` is compile-to-AST only, which never runs code.)"""
    import builtins
    import os
    import subprocess

    texts = [p.format(sentinel=tmp_path / "pwned") for p in ADVERSARIAL_PYTHON]
    for text in texts:  # the sentinel payloads are real Python: rejection is not a typo
        if "pwned" in text:
            ast.parse(text)
    reached = []

    def trap(*a, **k):
        reached.append(a)
        raise AssertionError("a dangerous primitive was reached")

    env = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    env.reset(_task("multi_turn_base_0"))
    qenv = B.BFCLEnv(B.BFCLOptions(tool_format="qwen", max_action_chars=1_000_000))
    qenv.reset(_task("multi_turn_base_0"))
    with monkeypatch.context() as m:
        m.setattr(builtins, "eval", trap)
        m.setattr(builtins, "exec", trap)
        m.setattr(os, "system", trap)
        m.setattr(os, "popen", trap)
        m.setattr(subprocess, "Popen", trap)
        results = [env.step(t) for t in texts] + [qenv.step(p) for p in ADVERSARIAL_QWEN]
    assert not reached
    assert all(r.info["invalid"] for r in results)
    assert not (tmp_path / "pwned").exists()


def test_resource_limits_and_process_globals():
    import decimal

    import mpmath
    task = next(t for t in ALL if "MathAPI" in t.spec["involved_classes"])
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    env.reset(task)
    prec, dps = decimal.getcontext().prec, mpmath.mp.dps
    for bomb in ("[square_root(number=2, precision=100000000)]", "[square_root(2, 10**9)]",
                 "[power(base=10, exponent=1000000000)]", "[logarithm(value=2, base=3, "
                 "precision=10000000)]"):
        r = env.step(bomb)
        assert r.info["invalid"], bomb
    r = env.step("[square_root(number=2, precision=3), logarithm(value=20, base=10, precision=2)]")
    assert not r.info["invalid"] and "1.41" in r.observation.text
    assert (decimal.getcontext().prec, mpmath.mp.dps) == (prec, dps)
    r = env.step("[power(base=10, exponent=5000)]")  # BFCL's own text for an unprintable int
    assert r.observation.text.startswith("power: Error during execution: Exceeds the limit")
