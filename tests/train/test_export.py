"""Export and checkpoints at scale: the export reads the parameters alone and streams them
(peak host memory against one shard file), params-only checkpoints, the end-of-run export."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.models import hf_io
from jaxscaffold.train.checkpoint import Checkpointer, find_params
from jaxscaffold.train.export import export_checkpoint
from jaxscaffold.train.trainer import train
from jaxscaffold.train.workloads.env_rl import EnvWorkload
from tests.train.configs import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dir_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


@pytest.mark.slow
def test_streaming_export_peak_memory_is_under_a_shard_file(tmp_path):
    """An 8-layer Qwen3 of 84M random parameters (335 MB in f32: its embedding and head alone
    155 MB each) saved with Adam moments as the trainer saves, exported into 128 MiB shards in
    a fresh process: its peak RSS above the baseline (the libraries loaded) is <= 1.2 x one
    shard, and the files hold the saved parameters exactly. A restore of the parameters would
    exceed the bound, and so would one whole f32 embedding on the host with the ~45 MB the
    export's libraries allocate whatever the model (Orbax's manager, TensorStore; measured
    with a 1-layer model); the pieces and chunk cache are ~25 MB here."""
    worker = [sys.executable, "-m", "tests.train.export_memory_worker"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    made = subprocess.run(worker + ["make", str(tmp_path / "run"), "--chunk_mb", "4"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    param_bytes = json.loads(made.stdout.splitlines()[0])["param_bytes"]
    out = subprocess.run(worker + ["export", str(tmp_path / "run"), str(tmp_path / "hf"), "--shard_mb", "128"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    shard = 128 * 2**20
    assert m["files"] >= 3 and param_bytes > 2 * shard
    assert m["peak_above_baseline_bytes"] <= 1.2 * shard, m
    # The files against the checkpoint's parameters, restored the ordinary way (all at once).
    ckpt = Checkpointer(str(tmp_path / "run" / "checkpoints"), async_save=False)
    cfg = config_lib.typed(ckpt.restore_extra(1)["config"])
    from jaxscaffold.models import qwen3
    from jaxscaffold.train.job import model_config
    target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=jax.sharding.SingleDeviceSharding(
        jax.devices()[0])), qwen3.param_shapes(model_config(cfg)))
    want = ckpt.read_params(target, 1)
    ckpt.close()
    _, got = hf_io.load_pretrained(str(tmp_path / "hf"))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


@pytest.mark.slow
def test_params_only_checkpoints_export_at_end_and_a_refused_resume(tmp_path):
    """checkpoint.params_only_every=1: out_dir/params holds every step's parameters without the
    optimizer state (about 1/3 of a full checkpoint); a resume redoes and saves again the
    params-only steps after its full one; the export of a step only params/ holds is the
    parameters the loop trained with; export.at_end wrote out_dir/hf (verified by
    transformers); a resume with params-only checkpoints alone is one line, refused."""
    seen = {}

    class Recording(EnvWorkload):
        def collect(self, job, params, step):
            seen.setdefault(step, [np.asarray(x) for x in jax.tree.leaves(params)])
            return super().collect(job, params, step)

    cfg = lambda steps: tiny_config(tmp_path, steps=steps, **{
        "eval.every": 0, "checkpoint.every": 2, "checkpoint.params_only_every": 1,
        "export.at_end": True, "export.verify": True})
    first = train(cfg(3), workload=Recording)
    assert sorted(os.listdir(tmp_path / "params")) == ["1", "2", "3"]
    assert sorted(p for p in os.listdir(tmp_path / "checkpoints") if p.isdigit()) == ["2", "3"]
    ratio = _dir_bytes(tmp_path / "params" / "3") / _dir_bytes(tmp_path / "checkpoints" / "3")
    assert 0.25 < ratio < 0.4, ratio
    # A resume from step 2 (the full step 3 lost) drops params-only step 3 and saves it again.
    import shutil
    shutil.rmtree(tmp_path / "checkpoints" / "3")
    out = train(cfg(3), workload=Recording)
    assert [h["step"] for h in out["history"]] == [1, 2, 3] and out["history"][1] == first["history"][1]
    assert sorted(os.listdir(tmp_path / "params")) == ["1", "2", "3"]
    assert out["export"]["step"] == 3 and out["export"]["max_abs_logit_diff"] < 1e-4
    _, final = hf_io.load_pretrained(str(tmp_path / "hf"))
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(out["state"].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    assert find_params(str(tmp_path), 1) == (str(tmp_path / "params"), 1)
    assert find_params(str(tmp_path)) == (str(tmp_path / "checkpoints"), 3)  # a tie: the full one
    report = export_checkpoint(str(tmp_path), str(tmp_path / "hf1"), step=1, verify=False)
    assert report == {"step": 1, "out": str(tmp_path / "hf1"), "max_abs_logit_diff": None}
    _, step1 = hf_io.load_pretrained(str(tmp_path / "hf1"))
    for a, b in zip(jax.tree.leaves(step1), seen[2]):  # step 2 collected with step 1's parameters
        np.testing.assert_array_equal(np.asarray(a), b)

    shutil.rmtree(tmp_path / "checkpoints")
    with pytest.raises(config_lib.ConfigError, match=r"params-only checkpoints \(steps \[1, 2, 3\]\) and no full") as e:
        train(cfg(4))
    assert "\n" not in str(e.value)


def test_export_and_params_only_fields_are_validated(tmp_path):
    for field, bad in (("checkpoint.params_only_every", -1), ("checkpoint.params_only_keep", -2),
                       ("export.dtype", "int8")):
        with pytest.raises(config_lib.ConfigError, match=field.replace(".", r"\.")):
            config_lib.typed(tiny_config(tmp_path, **{field: bad}))
    old = config_lib.typed(tiny_config(tmp_path)).to_dict()  # a config written before the fields
    del old["export"], old["checkpoint"]["params_only_every"], old["checkpoint"]["params_only_keep"]
    cfg = config_lib.from_configdict(config_lib.saved(old))  # as eval and export read a checkpoint's
    assert cfg.export.at_end is False and cfg.checkpoint.params_only_every == 0


def test_lora_run_exports_the_merged_weights_at_the_end(tmp_path):
    """export.at_end on a LoRA run over a preset's random base: the HF directory holds
    lora.merge(base, adapters) of the final adapters (the streamed merge against the in-memory
    one), and transformers reloads it with our logits. On the rooms words (320 ids; the export
    writes their tokenizer): the merge does not depend on the vocabulary, and Qwen3's cost 4 of
    17 CPU-s."""
    from jaxscaffold.models import lora as lora_lib
    from jaxscaffold.train.job import build_model, lora_config
    cfg = tiny_config(tmp_path, steps=1, **{"eval.every": 0, "checkpoint.every": 1, "lora.rank": 4,
                                            "lora.alpha": 8.0, "lora.targets": "q,down", "rl.lr": 1e-2,
                                            "export.at_end": True, "export.verify": True, "model.vocabulary": "rooms"})
    out = train(cfg)
    assert out["export"]["max_abs_logit_diff"] < 1e-4
    typed = config_lib.typed(cfg)
    _, base = build_model(typed, None)
    want = lora_lib.merge(base, out["state"].params, lora_config(typed.lora))
    assert float(np.abs(np.asarray(want["layers"]["q"]) - np.asarray(base["layers"]["q"], np.float32)).max()) > 0
    _, got = hf_io.load_pretrained(str(tmp_path / "hf"))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float32), rtol=0, atol=1e-7, err_msg=str(path))


@pytest.mark.slow
def test_eval_reads_a_params_only_checkpoint(tmp_path, monkeypatch):
    """launch/eval.py --checkpoint on a run whose only checkpoint is params-only: the greedy
    episodes equal those of the full checkpoint of the same step, and a newer params-only step
    of other parameters (the final norm zeroed) changes them. (eval.py's main in this process,
    where its programs compile once; tests/envs/test_eval_gold.py runs eval.py as a command.)"""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "launch"))
    import eval as eval_launcher
    # On the word vocabulary (eval.py takes the checkpoint's): which checkpoint is read does not
    # depend on Qwen3's.
    params = train(tiny_config(tmp_path / "run", steps=1, words=True, **{"eval.every": 0, "checkpoint.every": 1,
                                                            "checkpoint.params_only_every": 1}))["state"].params

    def episodes(name):
        out = tmp_path / f"{name}.jsonl"
        eval_launcher.main(["--config", "tiny.py", "--config.envs.eval=letters:test:2", "--config.eval.tasks=2",
                            "--config.rollout.max_new_tokens=4", "--policy", "model", "--checkpoint",
                            str(tmp_path / "run"), "--workers", "0", "--out", str(out)])
        return [json.loads(line)["conversation"] for line in open(out)]

    full = episodes("full")
    os.rename(tmp_path / "run" / "checkpoints", tmp_path / "run" / "moved")
    assert episodes("params_only") == full and len(full) == 2
    ckpt = Checkpointer(str(tmp_path / "run" / "params"), async_save=False)
    ckpt.save(2, {"params": dict(params, final_norm=params["final_norm"] * 0)}, ckpt.restore_extra(1))
    ckpt.close()
    assert episodes("zeroed") != full
