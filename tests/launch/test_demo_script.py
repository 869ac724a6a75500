"""launch/demo.py: the model tour runs and leaves no temporary folder behind."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # 110 s on the shared 2-core machine under load: it compiles the sampler
def test_the_tour_runs_and_removes_its_temporary_export(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "demo.py"), "--turns", "1",
                          "--max-new-tokens", "4"], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    exported = next(line for line in out.stdout.splitlines() if line.startswith("[hf]"))
    assert str(scratch) in exported and "config.json" in exported  # it was written there ...
    assert [p for p in scratch.iterdir() if p.name.startswith("jaxscaffold-demo-")] == []  # ... and removed
    assert "[done]" in out.stdout
