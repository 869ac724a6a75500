"""LoRA on two processes (jax.distributed on localhost, gloo): each feeding its half of the
batch, they take the same adapter steps as one process with the same 4 devices, and merge the
same sharded parameters."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_lora_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(worker: str, n: int, out: str, exact: bool = False, timeout: int = 300) -> None:
    """Runs `n` processes of `worker`; `exact`: XLA's default emitters (tests/conftest.py), for
    runs whose sampled tokens must not depend on how many rows a process decodes together."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS")}
    env["PYTHONPATH"] = ROOT
    if exact:
        env["JAXSCAFFOLD_TEST_XLA_FLAGS"] = os.environ["JAXSCAFFOLD_EXACT_XLA_FLAGS"]
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, worker, str(i), str(n), port, out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(n)]
    for p in procs:
        log, _ = p.communicate(timeout=timeout)
        assert p.returncode == 0, log[-3000:]


def run_workers(n: int, out: str):
    start_workers(WORKER, n, out)
    return dict(np.load(out + ".npz")), json.load(open(out + ".json"))


@pytest.mark.slow
def test_two_process_lora_steps_match_one_process(tmp_path):
    one, losses_one = run_workers(1, str(tmp_path / "one"))
    two, losses_two = run_workers(2, str(tmp_path / "two"))
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5)
    assert one.keys() == two.keys() and any(k.startswith("adapters") for k in one)
    assert np.abs(one["adapters['q']['a']"] - two["adapters['q']['a']"]).max() < 1e-6
    for k in one:
        np.testing.assert_allclose(two[k], one[k], atol=1e-6, rtol=1e-5, err_msg=k)


LOOP_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_lora_loop_worker.py")


@pytest.mark.slow
def test_two_process_lora_loop_matches_one_process(tmp_path):
    """The real loop with LoRA on 2 processes x 1 device equals it on 1 process x 2 devices:
    rollouts decode with the merged parameters (merged over the global arrays, then gathered
    onto each process), every process logs the one-process metrics and ends with the same
    adapters (to f32 rounding: see test_multihost.py's loop test)."""
    runs = {}
    for n in (1, 2):
        out = str(tmp_path / str(n))
        os.makedirs(out)
        start_workers(LOOP_WORKER, n, out, exact=True, timeout=600)
        runs[n] = ([json.load(open(os.path.join(out, f"process{i}.json")))["history"] for i in range(n)],
                   dict(np.load(os.path.join(out, "adapters.npz"))))
    (one,), adapters_one = runs[1]
    histories, adapters_two = runs[2]
    assert sum(h["train/grad_norm"] > 0 for h in one) >= 1 and "eval/success" in one[1]
    for two in histories:
        for h_two, h_one in zip(two, one, strict=True):
            for k, v in h_one.items():
                if not k.startswith("time/") and not isinstance(v, str):
                    np.testing.assert_allclose(h_two[k], v, rtol=1e-5, atol=1e-7, err_msg=k)
    assert adapters_one.keys() == adapters_two.keys()
    for k in adapters_one:
        np.testing.assert_allclose(adapters_two[k], adapters_one[k], atol=2e-5, rtol=0, err_msg=k)
