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


def run_workers(n: int, out: str):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS")}
    env["PYTHONPATH"] = ROOT
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, WORKER, str(i), str(n), port, out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(n)]
    for p in procs:
        log, _ = p.communicate(timeout=300)
        assert p.returncode == 0, log[-3000:]
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
