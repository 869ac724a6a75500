"""Two processes under jax.distributed (localhost, gloo CPU collectives), each feeding its half of
the batch, take the same train steps as one process with the same 4 devices, and run the same
training loop as one process, for full fine-tuning and for LoRA (the adapters' steps, the same
sharded merged parameters), with bounded staleness, and with partial rollouts (two processes).
One process pair runs every variant (`VARIANTS`; the loop worker's runs one after another):
starting the processes and the distributed runtime, and compiling each process's programs,
are most of each test's time."""

import json
import os

import numpy as np
import pytest

from tests.train import multihost_setup

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")
VARIANTS = ("full", "lora")


def _results(out):
    """{variant: (gathered arrays, losses)} a launch of the train-step worker wrote."""
    return {v: (dict(np.load(f"{out}_{v}.npz")), json.load(open(f"{out}_{v}.json"))) for v in VARIANTS}


@pytest.mark.slow
def test_two_process_train_steps_match_one_process(tmp_path):
    one_out, two_out = str(tmp_path / "one"), str(tmp_path / "two")
    # One launch after the other: the loop test's launches at the same time cost 7-14% more
    # CPU (mostly system time) on 2 cores, and CPU is what bounds the suite's time.
    for n, out in ((1, one_out), (2, two_out)):
        multihost_setup.wait(multihost_setup.Launch(WORKER, n, out), timeout=600)
    one, two = _results(one_out), _results(two_out)
    for variant in VARIANTS:
        (params_one, losses_one), (params_two, losses_two) = one[variant], two[variant]
        np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5, err_msg=variant)
        assert params_one.keys() == params_two.keys()
        if variant == "lora":  # the adapters trained, and merged into the same sharded parameters
            assert any(k.startswith("adapters") for k in params_one)
            assert np.abs(params_one["adapters['q']['a']"] - params_two["adapters['q']['a']"]).max() < 1e-6
        for k in params_one:
            np.testing.assert_allclose(params_two[k], params_one[k], atol=1e-6, rtol=1e-5, err_msg=f"{variant}: {k}")


LOOP_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_loop_worker.py")


def _loop_results(n, out):
    """(final parameters, each process's runs) that `n` processes of the loop worker wrote; a
    run: {"history", "ran", "lora": {"history", "adapters" (process 0)}, "stale", "dapo",
    "refused", "partial" and "unswapped" (n > 1)}."""
    runs = [json.load(open(os.path.join(out, f"process{i}.json"))) for i in range(n)]
    for i, run in enumerate(runs):
        for variant in ("lora", "stale") + (("dapo", "refused", "partial", "unswapped") if n > 1 else ()):
            run[variant] = json.load(open(os.path.join(out, f"process{i}_{variant}.json")))
    runs[0]["lora"]["adapters"] = dict(np.load(os.path.join(out, "adapters.npz")))
    return dict(np.load(os.path.join(out, "params.npz"))), runs


@pytest.fixture(scope="module")
def loop_runs(tmp_path_factory):
    """The loop worker on one process, then on two (one pair of runs for the test below; each
    runs full, LoRA, stale and, on two processes, DAPO, refused, partial and unswapped runs):
    (directory, (params, runs) of one process, (params, runs) of two)."""
    tmp_path = tmp_path_factory.mktemp("loop")
    for n, name in ((1, "one"), (2, "two")):
        os.makedirs(tmp_path / name)
        multihost_setup.wait(multihost_setup.Launch(LOOP_WORKER, n, str(tmp_path / name), exact=True), timeout=1500)
    return tmp_path, _loop_results(1, str(tmp_path / "one")), _loop_results(2, str(tmp_path / "two"))


@pytest.mark.slow
def test_two_process_loop_matches_one_process(loop_runs):
    """For full fine-tuning and LoRA, the real loop (tiny config on a word vocabulary and the toy env, 2 steps, rollouts with the bandit's feedback,
    evaluation, checkpoints) on 2 processes x 1 device equals it on 1 process x 2 devices: each
    process runs its half of the groups, feeds its rows of the global batch, and gathers the
    metrics, the feedback log and the bandit's signal, so every process logs the one-process
    numbers and makes the same bandit choices.

    The rollouts are sampled (T = 1, groups of two): an episode's sampling seeds derive from its
    global episode id, so process 1 samples exactly the one-process run's episodes of its groups.

    Equal means to f32 rounding, not bitwise: the sampler's log-probs (the loss's old_logp)
    come from a batch of 2 rows per process instead of 4 and differ in the last bit (ratios
    1 +- 1e-7), and Adam's normalised first steps turn that into parameter differences of a
    few 1e-6 where a gradient entry is near zero (the update itself is lr = 3e-2 per entry).

    With LoRA, rollouts decode with the merged parameters (merged over the global arrays, then
    gathered onto each process); every process logs the one-process metrics and ends with the
    same adapters (to f32 rounding, as above)."""
    tmp_path, (one, (run_one,)), (two, runs_two) = loop_runs
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

    # LoRA (the same loop on the adapters).
    lora_one, adapters_one = run_one["lora"]["history"], run_one["lora"]["adapters"]
    adapters_two = runs_two[0]["lora"]["adapters"]
    assert sum(h["train/grad_norm"] > 0 for h in lora_one) >= 1 and "eval/success" in lora_one[1]
    for run in runs_two:
        for h_two, h_one in zip(run["lora"]["history"], lora_one, strict=True):
            for k, v in h_one.items():
                if not k.startswith("time/") and not isinstance(v, str):
                    np.testing.assert_allclose(h_two[k], v, rtol=1e-5, atol=1e-7, err_msg=f"lora: {k}")
    assert adapters_one.keys() == adapters_two.keys()
    for k in adapters_one:
        np.testing.assert_allclose(adapters_two[k], adapters_one[k], atol=2e-5, rtol=0, err_msg=f"lora: {k}")
    _staleness_matches_one_process(loop_runs)
    _partial_rollouts_on_two_processes(loop_runs)


def _staleness_matches_one_process(loop_runs):
    """(Part of the loop test, which shares its processes: as one test, the xdist workers cannot
    run the module's processes twice.) rollout.max_staleness = 1 on two processes: the
    collector's thread runs each process's share of the next step's rollouts while the main
    thread trains, its gathers over the coordination service's key-value store and its
    parameters converted by the main thread, so no collective of one thread meets another's. The schedule is fixed by the step (steps 1
    and 2 sampled by version 0, step 3 by version 1), so the two processes together run the
    one-process episodes and log its metrics (to f32 rounding, as above), evaluation pausing
    the collector at step 2.

    A workload whose collect is not declared safe off the main thread is refused with k > 0
    on several processes."""
    _, (_, (run_one,)), (_, runs_two) = loop_runs
    stale_one = run_one["stale"]
    ran = sorted(map(tuple, runs_two[0]["stale"]["ran"] + runs_two[1]["stale"]["ran"]))
    assert ran == sorted(map(tuple, stale_one["ran"]))
    rows = 4 * 2  # tasks x group size
    assert [(h["rollout/staleness_0"], h["rollout/staleness_1"]) for h in stale_one["history"]] == \
        [(rows, 0), (0, rows), (0, rows)]
    assert "eval/success" in stale_one["history"][1]
    for run in runs_two:
        for h_two, h_one in zip(run["stale"]["history"], stale_one["history"], strict=True):
            assert h_two.keys() == h_one.keys()
            for k, v in h_one.items():
                if isinstance(v, str):
                    assert h_two[k] == v, k
                elif not k.startswith("time/"):
                    np.testing.assert_allclose(h_two[k], v, rtol=1e-5, atol=1e-7, err_msg=f"stale: {k}")

    # A workload that does not declare its collect safe off the main thread is refused there.
    assert all("Unmarked workload's collect may issue device collectives" in run["refused"]["refused"]
               for run in runs_two)


def _partial_rollouts_on_two_processes(loop_runs):
    """(Part of the loop test, as above.) rollout.partial with DAPO on two processes (k = 1, 3
    steps, decode chunks of 2 tokens): a version the trainer publishes while a step's episodes
    run reaches them at a chunk that timing decides, so the run is checked for what holds
    whichever chunk that is. The run completes; every training row's sampled tokens each carry
    a version between the step's scheduled one and the newest the trainer can have published
    by then (step - 1); the staleness metrics, summed over the processes, are those of the two
    processes' rows; each process trained exactly its share of each step's groups, whole.

    With partial rollouts on but no version published mid-collect (the worker's update of step
    s returns only once step s + 1 is collected), a 2-step run is the staleness run's first two
    steps, episode for episode and metric for metric."""
    _, _, (_, runs_two) = loop_runs
    partial = [run["partial"] for run in runs_two]
    no_time = lambda h: {k: v for k, v in h.items() if not k.startswith("time/")}  # noqa: E731
    assert [no_time(h) for h in partial[0]["history"]] == [no_time(h) for h in partial[1]["history"]]
    assert [h["step"] for h in partial[0]["history"]] == [1, 2, 3]
    share = {0: {0, 1}, 1: {2, 3}}  # process p's groups of each generation batch's 4
    for h in partial[0]["history"]:
        step = h["step"]
        mine = [[r for r in p["rows"] if r[0] == step] for p in partial]
        for p, rows in enumerate(mine):
            groups = {r[1] for r in rows}
            assert len(groups) == 2 and {g % 4 for g in groups} <= share[p], (step, p, groups)
            assert sorted(r[1:3] for r in rows) == sorted([g, i] for g in groups for i in range(4))
        rows = mine[0] + mine[1]
        scheduled, newest = max(0, step - 2), step - 1
        token_ages, row_ages, mixed = {}, {}, 0
        for _, _, _, versions, sampled in rows:
            versions = {int(v): n for v, n in versions.items()}
            assert sum(versions.values()) == sampled > 0 and set(versions) <= set(range(scheduled, newest + 1))
            for v, n in versions.items():
                token_ages[newest - v] = token_ages.get(newest - v, 0) + n
            row_ages[newest - min(versions)] = row_ages.get(newest - min(versions), 0) + 1
            mixed += len(versions) > 1
        assert {d: h[f"rollout/token_staleness_{d}"] for d in (0, 1)} == {d: token_ages.get(d, 0) for d in (0, 1)}
        assert {d: h[f"rollout/staleness_{d}"] for d in (0, 1)} == {d: row_ages.get(d, 0) for d in (0, 1)}
        assert h["rollout/mixed_version_rows"] == mixed and h["rollout/stale_dropped_rows"] == 0
        assert not any(k.startswith(("rollout/staleness_", "rollout/token_staleness_")) and k[-1] not in "01"
                       for k in h)
    assert partial[0]["history"][0]["rollout/token_staleness_1"] == 0  # step 1: version 0 is the newest

    for run in runs_two:
        unswapped, stale = run["unswapped"], run["stale"]
        assert sorted(map(tuple, unswapped["ran"])) == sorted(tuple(r) for r in stale["ran"] if r[0] <= 2)
        for h_partial, h_stale in zip(unswapped["history"], stale["history"][:2], strict=True):
            assert h_partial.keys() - h_stale.keys() == {"rollout/token_staleness_0", "rollout/token_staleness_1",
                                                         "rollout/mixed_version_rows"}
            assert h_partial["rollout/mixed_version_rows"] == 0
            for k, v in no_time(h_stale).items():
                if isinstance(v, str):
                    assert h_partial[k] == v, k
                else:  # (to f32 rounding, as above: which rows decode together follows timing)
                    np.testing.assert_allclose(h_partial[k], v, rtol=1e-5, atol=1e-7, err_msg=f"unswapped: {k}")
