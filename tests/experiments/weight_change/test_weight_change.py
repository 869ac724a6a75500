"""`weight_change` and `experiments/weight_change/weight_change.py` on tiny random checkpoints written with
`hf_io.save_pretrained`: zero for identical weights, a known perturbation's exact relative
norm, a NumPy reference of the formula, and one-line errors with exit status 2."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxscaffold.models import config as config_lib
from jaxscaffold.models import hf_io, qwen3
from experiments.weight_change import relative_change as wc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONFIG = config_lib.tiny(vocab_size=512, num_layers=3)


def host_params(seed: int = 0, config=CONFIG) -> dict:
    return jax.tree.map(np.array, qwen3.init_params(config, jax.random.PRNGKey(seed)))


def save(path, params, config=CONFIG, **kw) -> str:
    hf_io.save_pretrained(str(path), config, params, **kw)
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "weight_change", "weight_change.py"), *map(str, args)],
                          check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})


def numpy_reference(base: str, trained: str) -> dict:
    """The formula on whole tensors loaded by the safetensors library."""
    b, t = load_file(os.path.join(base, "model.safetensors")), load_file(os.path.join(trained, "model.safetensors"))
    hf = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
          "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
    out = {}
    for i in range(CONFIG.num_layers):
        for m, name in hf.items():
            w, v = b[f"model.layers.{i}.{name}.weight"].astype(np.float64), t[f"model.layers.{i}.{name}.weight"].astype(np.float64)
            out[i, m] = np.linalg.norm(v - w) / np.linalg.norm(w)
    return out


@pytest.fixture(scope="module")
def base_params():
    return host_params(0)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, base_params):
    return save(tmp_path_factory.mktemp("base"), base_params)


def test_identical_checkpoints_changed_nothing(tmp_path, base_dir, base_params):
    copy = save(tmp_path / "copy", base_params, max_shard_bytes=100_000)  # sharded, with an index
    assert os.path.exists(os.path.join(copy, "model.safetensors.index.json"))
    report = wc.weight_change(base_dir, copy)
    assert len(report["layers"]) == CONFIG.num_layers
    assert all(row[m] == 0.0 for row in report["layers"] for m in wc.MODULES)
    assert report["overall"] == 0.0 and report["overall_mean"] == 0.0 and set(report["mean"]) == set(wc.MODULES)


def test_one_perturbed_matrix_changes_by_exactly_its_relative_norm(tmp_path, base_dir, base_params):
    params = jax.tree.map(np.copy, base_params)
    w = params["layers"]["up"][1].copy()  # ours is [in, out]; HF's is its transpose: the norms are the same
    delta = 0.01 * np.random.default_rng(0).standard_normal(w.shape).astype(np.float32)
    params["layers"]["up"][1] = w + delta
    report = wc.weight_change(base_dir, save(tmp_path / "trained", params))
    stored = (w + delta).astype(np.float64) - w.astype(np.float64)  # what float32 storage holds
    expected = np.linalg.norm(stored) / np.linalg.norm(w.astype(np.float64))
    np.testing.assert_allclose(report["layers"][1]["up"], expected, rtol=1e-12)
    np.testing.assert_allclose(expected, np.linalg.norm(delta) / np.linalg.norm(w), rtol=1e-5)
    changed = [(r["layer"], m) for r in report["layers"] for m in wc.MODULES if r[m] != 0.0]
    assert changed == [(1, "up")]
    np.testing.assert_allclose(report["mean"]["up"], expected / CONFIG.num_layers, rtol=1e-12)
    np.testing.assert_allclose(report["overall_mean"], expected / (CONFIG.num_layers * len(wc.MODULES)), rtol=1e-12)


def test_matches_a_numpy_reference_in_blocks_of_rows(tmp_path, base_dir, monkeypatch):
    trained = save(tmp_path / "trained", host_params(1))  # every matrix different
    monkeypatch.setattr(wc, "BLOCK_BYTES", 1000)  # several row blocks per tensor
    report = wc.weight_change(base_dir, trained)
    ref = numpy_reference(base_dir, trained)
    for row in report["layers"]:
        for m in wc.MODULES:
            np.testing.assert_allclose(row[m], ref[row["layer"], m], rtol=1e-10)
    for m in wc.MODULES:
        np.testing.assert_allclose(report["mean"][m], np.mean([ref[i, m] for i in range(CONFIG.num_layers)]), rtol=1e-10)
    b, t = load_file(os.path.join(base_dir, "model.safetensors")), load_file(os.path.join(trained, "model.safetensors"))
    names = [n for n in b if "_proj" in n]
    overall = np.sqrt(sum(np.sum((t[n].astype(np.float64) - b[n]) ** 2) for n in names)
                      / sum(np.sum(b[n].astype(np.float64) ** 2) for n in names))
    np.testing.assert_allclose(report["overall"], overall, rtol=1e-10)


def test_the_launcher_prints_a_table_or_one_json_object(tmp_path, base_dir, base_params):
    params = jax.tree.map(np.copy, base_params)
    params["layers"]["q"][0] *= 1.5  # relative change exactly 0.5
    trained = save(tmp_path / "trained", params)
    out = run(base_dir, trained)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.split()[:2] == ["0", "5.000e-01"] for line in lines), out.stdout
    assert lines[-1].startswith("overall:") and any(line.startswith("  mean") for line in lines)
    out = run(base_dir, trained, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["layers"][0]["q"] == pytest.approx(0.5, rel=1e-6) and report["layers"][1]["q"] == 0.0


def test_errors_are_one_line_with_exit_status_2(tmp_path, base_dir):
    other = save(tmp_path / "wider", host_params(0, CONFIG.replace(intermediate_size=256)),
                 CONFIG.replace(intermediate_size=256))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(hf_io.config_to_hf(CONFIG, "float32")))
    for args, match in [((base_dir, tmp_path / "missing"), "missing: not a directory"),
                        ((base_dir, other), "intermediate_size is 192"),
                        ((base_dir, empty), "no model.safetensors or model.safetensors.index.json")]:
        out = run(*args)
        assert out.returncode == 2 and out.stderr.startswith("error: ") and match in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_mismatched_shapes_with_the_same_config_are_refused(tmp_path, base_dir, base_params):
    bad = save(tmp_path / "bad", base_params)
    b = load_file(os.path.join(bad, "model.safetensors"))
    b["model.layers.2.mlp.down_proj.weight"] = b["model.layers.2.mlp.down_proj.weight"][:, :-1].copy()
    from safetensors.numpy import save_file
    save_file(b, os.path.join(bad, "model.safetensors"))
    with pytest.raises(wc.WeightChangeError, match="model.layers.2.mlp.down_proj.weight: shape"):
        wc.weight_change(base_dir, bad)
