"""launch/device_check.sh / .py on CPU with tiny shapes: every part runs and reports, parity
holds; the script runs the checkout's python and passes its flags on."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_device_check_runs_on_cpu(tmp_path):
    """Every part, as the script runs them by default: parity, decode (contiguous and paged
    caches, and at three fills), train, the attention kernels (flash and, on CPU, the XLA kernel
    in the fused kernel's place) and the rollout part, which says when there is no benchmark."""
    out = tmp_path / "check.json"
    # one device (the check uses one; the tests' 8 are this process's), the tests' compile flags
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": os.environ["JAXSCAFFOLD_TEST_XLA_FLAGS"]}
    run = subprocess.run(["bash", os.path.join(ROOT, "launch", "device_check.sh"), str(out), "--quick"],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.load(open(out))
    assert report["parity"]["max_abs_logit_diff"] < 1e-4 and report["parity"]["grad_rel_diff"] < 1e-4
    assert [d["batch"] for d in report["decode"]] == [2, 4]
    assert all(0 < d["of_limit"] and d["tokens_per_s"] > 0 for d in report["decode"])
    assert report["train"]["seconds_per_step"] > 0 and 0 < report["train"]["mfu"] < 1
    assert [(a["kernel"], a["tokens"]) for a in report["attention"]] == [
        ("flash", 256), ("xla", 256), ("flash", 512), ("xla", 512)]
    assert all(a["seconds"] > 0 and a["tflops_per_s"] > 0 for a in report["attention"])
    assert [d["fill"] for d in report["decode_fill"]] == [0.125, 0.5, 1]
    assert [d["batch"] for d in report["decode_paged"]] == [2, 4]  # the paged cache, as decode
    assert all(0 < d["of_limit"] and d["tokens_per_s"] > 0 for d in report["decode_paged"])
    assert all(d["step_s"] > 0 and d["over_bytes_model"] > 0 for d in report["decode_fill"])
    assert "skipped" in report["rollout"] or isinstance(report["rollout"], list)


def test_parts_runs_only_the_parts_named(tmp_path):
    """`--parts` picks parts (the cheapest here; the default run above checks every part's figures)."""
    out = tmp_path / "check.json"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "device_check.py"), "--quick", "--out", str(out),
                          "--parts", "attention"],
                         capture_output=True, text=True, timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.load(open(out))
    assert [(a["kernel"], a["tokens"]) for a in report["attention"]] == [
        ("flash", 256), ("xla", 256), ("flash", 512), ("xla", 512)]
    assert not set(report) & {"parity", "decode", "decode_paged", "decode_fill", "train", "rollout"}, sorted(report)


def test_the_script_passes_flags_on_to_the_checkouts_python(tmp_path):
    # PATH without the venv: the system python3 has no jax, so only .venv/bin/python gets as
    # far as argparse, which names the flag it did not expect (a flag, not an output file).
    env = {**os.environ, "PATH": "/usr/bin:/bin", "OUT": str(tmp_path)}
    run = subprocess.run(["bash", os.path.join(ROOT, "launch", "device_check.sh"), "--no-such-flag"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 2 and "unrecognized arguments: --no-such-flag" in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "--no-such-flag").exists() and not list(tmp_path.iterdir())
