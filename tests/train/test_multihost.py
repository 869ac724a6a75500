"""Two processes under jax.distributed (localhost, gloo CPU collectives), each feeding its half of
the batch, take the same two train steps as one process with the same 4 devices."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(exact: bool = False) -> dict:
    """The workers' environment; `exact`: XLA's default emitters (tests/conftest.py), for runs
    whose sampled tokens must not depend on how many rows a process decodes together."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS")}
    env["PYTHONPATH"] = ROOT
    if exact:
        env["JAXSCAFFOLD_TEST_XLA_FLAGS"] = os.environ["JAXSCAFFOLD_EXACT_XLA_FLAGS"]
    return env


def _run(n, out):
    env = _env()
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, WORKER, str(i), str(n), port, out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(n)]
    for p in procs:
        log, _ = p.communicate(timeout=300)
        assert p.returncode == 0, log[-3000:]
    return dict(np.load(out + ".npz")), json.load(open(out + ".json"))


@pytest.mark.slow
def test_two_process_train_steps_match_one_process(tmp_path):
    one, losses_one = _run(1, str(tmp_path / "one"))
    two, losses_two = _run(2, str(tmp_path / "two"))
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5)
    assert one.keys() == two.keys()
    for k in one:
        np.testing.assert_allclose(two[k], one[k], atol=1e-6, rtol=1e-5, err_msg=k)


LOOP_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_loop_worker.py")


def _run_loop(n, out):
    env = _env(exact=True)
    port = str(_free_port())
    os.makedirs(out, exist_ok=True)
    procs = [subprocess.Popen([sys.executable, LOOP_WORKER, str(i), str(n), port, out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(n)]
    for p in procs:
        log, _ = p.communicate(timeout=600)
        assert p.returncode == 0, log[-3000:]
    runs = [json.load(open(os.path.join(out, f"process{i}.json"))) for i in range(n)]
    if n > 1:
        for i, run in enumerate(runs):
            run["dapo"] = json.load(open(os.path.join(out, f"process{i}_dapo.json")))
    return dict(np.load(os.path.join(out, "params.npz"))), runs


@pytest.mark.slow
def test_two_process_loop_matches_one_process(tmp_path):
    """The real loop (tiny config on the toy env, 2 steps, rollouts with the bandit's feedback,
    evaluation, checkpoints) on 2 processes x 1 device equals it on 1 process x 2 devices: each
    process runs its half of the groups, feeds its rows of the global batch, and gathers the
    metrics, the feedback log and the bandit's signal, so every process logs the one-process
    numbers and makes the same bandit choices.

    The rollouts are sampled (T = 1, groups of two): an episode's sampling seeds derive from its
    global episode id, so process 1 samples exactly the one-process run's episodes of its groups.

    Equal means to f32 rounding, not bitwise: the sampler's log-probs (the loss's old_logp)
    come from a batch of 2 rows per process instead of 4 and differ in the last bit (ratios
    1 +- 1e-7), and Adam's normalised first steps turn that into parameter differences of a
    few 1e-6 where a gradient entry is near zero (the update itself is lr = 3e-2 per entry)."""
    one, (run_one,) = _run_loop(1, str(tmp_path / "one"))
    two, runs_two = _run_loop(2, str(tmp_path / "two"))
    # Each process ran only its share, whole groups; together, exactly the one-process episodes.
    ran = [sorted(map(tuple, r["ran"])) for r in runs_two]
    assert ran[0] and ran[1] and not {g[:2] for g in ran[0]} & {g[:2] for g in ran[1]}
    assert sorted(ran[0] + ran[1]) == sorted(map(tuple, run_one["ran"]))
    assert {g for _, g, *_ in ran[0]} == {0, 1} and {g for _, g, *_ in ran[1]} == {2, 3}
    # Every process holds (and process 0 logs) the global metrics: the one-process ones.
    no_time = lambda h: {k: v for k, v in h.items() if not k.startswith("time/")}  # noqa: E731
    for run in runs_two:
        assert len(run["history"]) == 2
        for h_two, h_one in zip(run["history"], run_one["history"]):
            assert h_two.keys() == h_one.keys()
            for k, v in no_time(h_one).items():
                if isinstance(v, str):  # the bandit's arm
                    assert h_two[k] == v, k
                else:
                    np.testing.assert_allclose(h_two[k], v, rtol=1e-5, atol=1e-7, err_msg=k)
    assert "eval/success" in runs_two[1]["history"][1] and "feedback/arm" in runs_two[1]["history"][1]
    assert sum(h["train/grad_norm"] > 0 for h in run_one["history"]) >= 1  # not a trivial update
    assert len((tmp_path / "two" / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    # Process 0 logs every process's enrichments: the one-process log.
    feedback = (tmp_path / "one" / "run" / "feedback.jsonl").read_text()
    assert feedback and (tmp_path / "two" / "run" / "feedback.jsonl").read_text() == feedback
    assert one.keys() == two.keys()
    for k in one:
        np.testing.assert_allclose(two[k], one[k], atol=2e-5, rtol=0, err_msg=k)

    # DAPO on 2 processes (sampled rollouts, groups of 4): every process trains on its share of
    # mixed-success groups and both log the same gathered metrics.
    dapo = [run["dapo"] for run in runs_two]
    assert [no_time(h) for h in dapo[0]["history"]] == [no_time(h) for h in dapo[1]["history"]]
    for h in dapo[0]["history"]:
        step, batches = h["step"], h["rollout/generation_batches"]
        kept = {g: w for d in dapo for g, w in d["won"].items() if g.startswith(f"{step}/")}
        assert len(kept) == 4 and all(len(w) == 4 and len(set(w)) == 2 for w in kept.values())
        assert batches >= 1 and 4 + h["rollout/dropped_groups"] + h["rollout/overflow_groups"] <= 4 * batches
