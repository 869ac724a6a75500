"""The multi-host tests' two sides. In a worker: `configure`, its preamble (argv, fake CPU
devices and, on several processes, the coordinator variables `maybe_initialize_distributed`
reads, before jax starts). In a test: `Launch` a worker's processes (several launches may run
at once) and `wait` for them, which names a failing process's cause."""

import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def configure(total_devices: int):
    """(process id, process count, output path); imports and configures jax."""
    process_id, num_processes, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={total_devices // num_processes} "
                               + os.environ.get("JAXSCAFFOLD_TEST_XLA_FLAGS", ""))
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    if num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        os.environ.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(num_processes),
                          JAX_PROCESS_ID=str(process_id))
    return process_id, num_processes, out


def free_port() -> int:
    """A TCP port on localhost that is free now (for a launch's coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(exact: bool = False) -> dict:
    """The workers' environment; `exact`: XLA's default emitters (tests/conftest.py), for runs
    whose sampled tokens must not depend on how many rows a process decodes together."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS")}
    env["PYTHONPATH"] = ROOT
    if exact:
        env["JAXSCAFFOLD_TEST_XLA_FLAGS"] = os.environ["JAXSCAFFOLD_EXACT_XLA_FLAGS"]
    return env


class Launch:
    """`n` processes of `worker` (argv: process id, count, coordinator port, `out`), started;
    each writes its output to `<out>-process<i>.log`, kept with the test's files (a pipe read
    one process after the other would block a process whose output filled it)."""

    def __init__(self, worker: str, n: int, out: str, exact: bool = False):
        env, port = worker_env(exact), str(free_port())
        self.n, self.logs, self.procs = n, [f"{out}-process{i}.log" for i in range(n)], []
        for i in range(n):
            with open(self.logs[i], "w") as log:
                self.procs.append(subprocess.Popen([sys.executable, worker, str(i), str(n), port, out], env=env,
                                                   stdout=log, stderr=subprocess.STDOUT))


def wait(*launches: Launch, timeout: int = 300) -> None:
    """Waits for every process of `launches`. When one fails, the others are stopped (its
    launch's would wait for it in their next collective) and the failure names each failed
    process's exit status, a signal by name (a SIGKILL nobody sent is the kernel's OOM killer:
    see dmesg), and the tail of its log."""
    procs = [(launch, i, p) for launch in launches for i, p in enumerate(launch.procs)]
    deadline, timed_out, stopped = time.monotonic() + timeout, False, set()
    try:
        while True:
            codes = [p.poll() for _, _, p in procs]
            if None not in codes or any(c not in (None, 0) for c in codes):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.5)
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
                stopped.add(p)

    def status(p: subprocess.Popen) -> str:
        if p in stopped:
            return f"stopped after {timeout} s" if timed_out else "stopped (another process failed)"
        return f"killed by {signal.Signals(-p.returncode).name}" if p.returncode < 0 else f"exit status {p.returncode}"

    failed = [(launch, i, p) for launch, i, p in procs if p.returncode != 0]
    assert not failed, "\n".join(f"process {i} of {launch.n}: {status(p)}; {launch.logs[i]}:\n{log_tail(launch.logs[i])}"
                                  for launch, i, p in failed)


def log_tail(path: str, chars: int = 3000) -> str:
    """The last `chars` characters of a process's log."""
    with open(path, errors="replace") as f:
        return f.read()[-chars:]
