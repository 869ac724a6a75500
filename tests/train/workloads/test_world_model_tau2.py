"""RWML's triple collection on tau2 talks to the configured user simulator: the policy's
messages get the user model's replies as next states (never the no-user notice), and the
triples keep their domain (for per-domain metrics)."""

import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.config import Tau2User

from tests.train.configs import load_config

tau2 = pytest.importorskip("jaxscaffold.envs.tau2")

USER = Tau2User(preset="tiny", compute_dtype="float32", temperature=1.0, max_tokens=12, max_len=2048, slots=2)


@pytest.mark.slow
def test_tau2_triples_are_collected_with_the_served_user(tmp_path):
    from jaxscaffold.train import user_model
    from jaxscaffold.train.job import build_job
    from jaxscaffold.train.workloads.world_model import prepare_data
    user = {f"envs.tau2_user.{k}": getattr(USER, k) for k in ("preset", "compute_dtype", "temperature",
                                                               "max_tokens", "max_len", "slots")}
    cfg = config_lib.from_configdict(load_config("rwml_tiny", **{
        "out_dir": str(tmp_path), "envs.train": "tau2:retail/train:2", "envs.eval": "tau2:retail/test:1",
        "envs.train_split": "train", "envs.num_workers": 0, "rollout.max_len": 8192, "rollout.max_new_tokens": 8,
        "rollout.tasks_per_step": 1, "rollout.group_size": 2, "rwml.collect_policy": "model",
        "rwml.collect_tasks": 2, "rwml.rollouts_per_task": 1, "rwml.collect_max_turns": 2,
        "rwml.heldout_share": 0.5, "rwml.filter.enabled": False, "mesh.devices": 1, **user}))
    job, state = build_job(cfg)
    data = prepare_data(job, state.params, reward_fn=None)
    triples = data.train + data.heldout
    assert len(triples) == 4 and data.stats["triples/infra_failures"] == 0  # 2 tasks x 2 steps
    assert {t.env for t in triples} == {"tau2"} and {t.category for t in triples} == {"retail"}
    assert all(t.next_state and tau2.NO_USER not in t.next_state for t in triples)
    # The episodes' openings are the configured model's replies to tau2's user prompt of each
    # task: a fresh server of the same config repeats them (request 1 was the warm-up, then the
    # two resets, in the collection's task order).
    prompts = []
    for task in tau2.catalogue("retail/train")[:2]:
        got = []
        tau2.Tau2Env(user=lambda m: got.append(m) or "Hi.").reset(task)
        prompts.append(got[0])
    server = user_model.serve(cfg.envs.tau2_user)
    try:
        def opening(prompt, number):
            return server.reply({"messages": prompt, "temperature": 1.0, "max_tokens": 12,
                                 "seed": number})["choices"][0]["message"]["content"]
        orders = [{opening(prompts[0], 2), opening(prompts[1], 3)}, {opening(prompts[1], 2), opening(prompts[0], 3)}]
    finally:
        server.stop()
    assert {t.observation for t in triples if not t.history} in orders
