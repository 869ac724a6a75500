"""The preamble of the multi-host test workers: argv, fake CPU devices and, on several
processes, the coordinator variables `maybe_initialize_distributed` reads (before jax starts)."""

import os
import sys


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
