"""The metric logger: the ETA with evaluations, TensorBoard scalars and hyperparameters read
back from the event files, and the optional wandb backend read back from its offline run file."""

import glob
import io
import json
import os
import time

import pytest

from jaxscaffold.train.logger import MetricLogger, duration, eta_s, time_split


def test_eta_counts_the_evaluations_still_due():
    # 4 of 10 steps done in 100 s, of which 2 evaluations took 40 s: 15 s a step; steps 5..10
    # hold evaluations at 6, 8 and 10 (every 2): 6 * 15 + 3 * 20.
    assert eta_s(step=4, total=10, start=0, elapsed_s=100, eval_s=40, evals=2, eval_every=2) == (150.0, 0)
    # No evaluation measured yet: the training steps' share, and how many evaluations it leaves out.
    assert eta_s(step=2, total=10, start=0, elapsed_s=30, eval_s=0, evals=0, eval_every=5) == (120.0, 2)
    # Resumed at step 6: only the steps since count.
    assert eta_s(step=8, total=10, start=6, elapsed_s=20, eval_s=0, evals=0, eval_every=0) == (20.0, 0)
    assert [duration(s) for s in (42, 725, 11040)] == ["42s", "12m05s", "3h04m"]


def test_the_first_eta_is_within_2x_of_the_time_left(tmp_path):
    # A run as the tiny demo's: the first step compiles (40 s), the next ones take 3 s, an
    # evaluation every 10 steps takes 8 s (the first one 20 s, compiling). The first ETA shown
    # counts neither compile as a step's cost.
    now = [0.0]
    stream = io.StringIO()
    logger = MetricLogger(str(tmp_path), total_steps=30, stream=stream, eval_every=10, clock=lambda: now[0])
    ends = {}
    for step in range(1, 31):
        now[0] += 40.0 if step == 1 else 3.0
        metrics = {"step": step, "rollout/reward": 0.1}
        if step % 10 == 0:
            metrics["time/eval_s"] = 20.0 if step == 10 else 8.0
            now[0] += metrics["time/eval_s"]
        ends[step] = now[0]
        logger.log(step, metrics)
    logger.close([])
    lines = [line.strip("\r") for line in stream.getvalue().split("\n") if line.strip("\r")]
    assert lines[0].endswith("eta after step 2")
    first_eta = lines[1].split("eta ")[1]  # step 2: 28 steps of 3 s, then 3 evaluations not yet timed
    assert first_eta == "1m24s + 3 evals"
    left = ends[30] - ends[2]  # 84 s of steps and 36 s of evaluations
    assert left / 2 <= 84 <= left * 2
    eta_at_10 = lines[9].split("eta ")[1]  # one evaluation measured: the other two at its 20 s
    assert eta_at_10 == duration(20 * 3 + 2 * 20) and lines[-1].endswith("eta 0s")


def test_the_progress_line_shows_the_rollout_train_split(tmp_path):
    assert time_split({"time/rollout_s": 12.34, "time/train_s": 4.06}) == "  rollout 12.3s / train 4.1s"
    assert time_split({"time/rollout_s": 3.0, "time/train_s": 1.0, "time/rollout_idle_share": 0.414}) == \
        "  rollout 3.0s (idle 41%) / train 1.0s"
    assert time_split({"time/eval_s": 2.0}) == ""  # an evaluation-only row (step 0)
    stream = io.StringIO()
    logger = MetricLogger(str(tmp_path), total_steps=1, stream=stream)
    logger.log(1, {"step": 1, "rollout/reward": 0.5, "time/rollout_s": 6.0, "time/train_s": 2.0,
                   "time/rollout_idle_share": 0.25})
    logger.close([])
    assert "reward 0.500  rollout 6.0s (idle 25%) / train 2.0s  eta" in stream.getvalue()


def _events(tb_dir):
    """Every Event of the TFRecord files under `tb_dir` (length, crc, payload, crc records)."""
    from tensorboardX.proto.event_pb2 import Event
    out = []
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        data, pos = open(path, "rb").read(), 0
        while pos < len(data):
            n = int.from_bytes(data[pos:pos + 8], "little")
            out.append(Event.FromString(data[pos + 12:pos + 12 + n]))
            pos += 12 + n + 4
    return out


def test_tensorboard_gets_scalars_hparams_and_the_config(tmp_path):
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
    config = {"rl": {"lr": 0.03, "algorithm": "grpo"}, "steps": 3, "rwml": None}
    stream = io.StringIO()
    logger = MetricLogger(str(tmp_path), total_steps=3, stream=stream, eval_every=2, config=config)
    for step in (1, 2, 3):
        logger.log(step, {"step": step, "rollout/reward": step / 10, "train/lr": 0.03,
                          **({"time/eval_s": 1.0} if step == 2 else {})})
    logger.close([])
    scalars, hparams, texts = {}, {}, []
    for e in _events(str(tmp_path / "tb")):
        for v in e.summary.value:
            plugin = v.metadata.plugin_data.plugin_name
            if plugin == "hparams":
                data = HParamsPluginData.FromString(v.metadata.plugin_data.content)
                if data.HasField("session_start_info"):
                    hparams = {k: x.WhichOneof("kind") and getattr(x, x.WhichOneof("kind"))
                               for k, x in data.session_start_info.hparams.items()}
            elif plugin == "text":
                texts.append(v.tensor.string_val[0].decode())
            else:
                scalars[(v.tag, e.step)] = v.simple_value
    assert scalars[("rollout/reward", 2)] == pytest.approx(0.2) and scalars[("train/lr", 3)] == pytest.approx(0.03)
    assert hparams == {"rl.lr": 0.03, "rl.algorithm": "grpo", "steps": 3, "rwml": "None"}
    assert json.loads(texts[0].strip("`\n")) == config
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in lines] == [1, 2, 3]
    shown = [line.strip("\r") for line in stream.getvalue().split("\n")]
    assert shown[0].endswith("eta after step 2")  # step 1 compiles: nothing to extrapolate from yet
    assert "eval" not in shown[1].split("eta")[1]  # measured: counted in the figure


def _wandb_records(path):
    """The records of a wandb run file: a 7-byte header, then LevelDB-log chunks (crc 4, length 2,
    type 1: full / first / middle / last) in 32 KiB blocks, each record a `Record` protobuf."""
    from wandb.proto.wandb_internal_pb2 import Record
    data, pos, buf, out = open(path, "rb").read(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        n, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if pos + 7 + n > len(data):  # still being written
            break
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            out.append(Record.FromString(buf))
            buf = b""
    return out


def test_wandb_offline_backend_logs_the_scalars_and_the_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "run"
    logger = MetricLogger(str(out), total_steps=2, stream=io.StringIO(), config={"rl": {"lr": 0.03}},
                          wandb="offline", wandb_project="test")
    for step in (1, 2):
        logger.log(step, {"step": step, "rollout/reward": step / 10})
    logger.close([])
    (path,) = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    deadline = time.time() + 60  # wandb's service writes the file after `finish` returns
    while not any(r.WhichOneof("record_type") == "exit" for r in _wandb_records(path)) and time.time() < deadline:
        time.sleep(0.2)
    history, config, runs = {}, {}, []
    for r in _wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            history[items.get("_step")] = items
        elif kind == "run":
            runs.append(r.run)
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
    assert set(history) == {1, 2}, history
    assert history[1]["rollout/reward"] == 0.1 and history[2]["rollout/reward"] == 0.2
    assert config["rl"] == {"lr": 0.03}
    assert runs[0].project == "test" and runs[0].display_name == "run"
