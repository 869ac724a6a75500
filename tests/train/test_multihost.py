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


def _run(n, out):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS")}
    env["PYTHONPATH"] = ROOT
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
