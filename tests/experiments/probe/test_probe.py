"""The output-probability probe: its numbers equal transformers' Qwen3 on the exported weights
(the conversation rendered by the HF tokenizer's own chat template), and a model trained on the
enriched outputs (an SGD step) scores higher, read back from a checkpoint by experiments/probe/probe.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

pytest.importorskip("bfcl_eval")

from experiments.probe.cases import probe_cases  # noqa: E402
from jaxscaffold.models import hf_io  # noqa: E402
from jaxscaffold.models.chat import Qwen3ChatRenderer  # noqa: E402
from jaxscaffold.models.tokenizer import cached_hf_tokenizer_dir  # noqa: E402
from experiments.probe import scoring as probe  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _run_probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "probe", "probe.py"), *args, "--json"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": ROOT})


def _reference(hf_dir: str, cases) -> dict[str, tuple[float, int]]:
    """op -> (mean log-probability, tokens) by transformers alone: the HF chat template's ids,
    the last tool response's text (between its <tool_response> and </tool_response> ids)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    opening, closing = tok.convert_tokens_to_ids(["<tool_response>", "</tool_response>"])
    out = {}
    for c in cases:
        ids = tok.apply_chat_template(list(c.messages), tools=list(c.tools), tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in recent versions
        start = max(i for i, t in enumerate(ids) if t == opening) + 1
        end = max(i for i, t in enumerate(ids) if t == closing)
        with torch.no_grad():
            h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            logp = torch.log_softmax(model.lm_head(h[start - 1:end - 1]).double(), -1)  # h[t-1] predicts ids[t]
        target = torch.tensor(ids[start:end])
        out[c.operation] = (float(logp[torch.arange(len(target)), target].mean()), end - start)
    return out


def _last_tokens(rows, context: int):
    """Each row cut to its span and the `context` tokens before it (the span's offsets moved)."""
    cut = [max(0, start - context) for _, start, _ in rows]
    return [(ids[c:end], start - c, end - c) for (ids, start, end), c in zip(rows, cut)]


def _sft(config, params, rows, steps: int, lr: float):
    """`steps` plain SGD steps of the token cross-entropy on the rows' spans (the outputs)."""
    from jaxscaffold.rl.train_step import init_train_state, make_sft_step
    batch = probe.batch_rows(rows)
    batch.update(old_logp_BT=np.zeros(batch["tokens_BT"].shape, np.float32),
                 adv_B=np.zeros(len(rows), np.float32))
    opt = optax.sgd(lr)
    step = make_sft_step(config, opt, num_micro_batches=len(rows))  # a row at a time: its attention
    state = init_train_state(jax.tree.map(jnp.copy, params), opt)
    for _ in range(steps):
        state, _ = step(state, batch)
    return state.params


def test_probe_of_an_hf_model_equals_transformers(tmp_path):
    """`--model DIR` on the tiny preset: per operation the numbers of transformers alone. The
    random model's final norm is scaled up (x12) so its predictions are far from uniform and a
    misplaced span or a shifted target would show."""
    from jaxscaffold.models import config as model_config_lib
    from jaxscaffold.models import qwen3
    config = model_config_lib.tiny(param_dtype="float32", compute_dtype="float32")
    params = qwen3.init_params(config, jax.random.key(3))
    params = dict(params, final_norm=params["final_norm"] * 12.0)
    hf_dir = str(tmp_path / "hf")
    hf_io.save_pretrained(hf_dir, config, params, tokenizer_dir=str(cached_hf_tokenizer_dir()))
    run = _run_probe("--model", hf_dir)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    cases = probe_cases()
    ref = _reference(hf_dir, cases)
    assert list(report["operations"]) == [c.operation for c in cases] and len(cases) == 8
    for op, (mean, tokens) in ref.items():
        assert report["operations"][op]["tokens"] == tokens
        assert report["operations"][op]["mean_logprob"] == pytest.approx(mean, abs=1e-4), op
    assert report["mean_logprob"] == pytest.approx(np.mean([m for m, _ in ref.values()]), abs=1e-4)
    spread = [m for m, _ in ref.values()]
    # Far from the uniform log(1/151936) = -11.93 and apart from each other: the check can fail.
    assert max(spread) < -13 and max(spread) - min(spread) > 0.3, spread


@pytest.mark.slow
def test_training_on_the_outputs_raises_the_probe_score_read_from_a_checkpoint(tmp_path):
    """One SGD step of cross-entropy on the 8 outputs (the tiny run's initial model), saved as the
    run's checkpoint: `--checkpoint` reads it back and scores every operation higher. The step
    trains on each output after the last 200 tokens of its context (a whole ~3k-token row, most
    of it the tools block, made the step 7x as costly); the probe scores the whole rows."""
    from jaxscaffold.train.checkpoint import Checkpointer
    from jaxscaffold.train.job import build_job
    from tests.train.configs import tiny_config
    cfg = tiny_config(tmp_path / "run")
    job, state = build_job(cfg)
    cases = probe_cases()
    rows = [probe.probe_row(Qwen3ChatRenderer(job.tokenizer), c) for c in cases]
    before = probe.span_logprobs(state.params, job.model_config, rows)
    trained = _sft(job.model_config, state.params, _last_tokens(rows, 200), steps=1, lr=1.0)
    ckpt = Checkpointer(str(tmp_path / "run" / "checkpoints"), async_save=False)
    ckpt.save(1, state.replace(params=trained), {"step": 1, "config": cfg.to_dict()})  # the run's own layout
    ckpt.close()
    run = _run_probe("--checkpoint", str(tmp_path / "run"))
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    after = [report["operations"][c.operation]["mean_logprob"] for c in cases]
    print(f"probe mean log-probability: untrained {np.mean(before):.4f}, after one SGD step {np.mean(after):.4f}")
    assert report["step"] == 1
    assert after == pytest.approx(probe.span_logprobs(trained, job.model_config, rows), abs=1e-4)
    assert all(a > b + 0.5 for a, b in zip(after, before)), (before, after)


def test_missing_checkpoint_is_one_line_exit_2(tmp_path):
    for args in (["--checkpoint", str(tmp_path)], ["--model", str(tmp_path / "nothing")], []):
        run = _run_probe(*args)
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and run.stderr.startswith("error: "), (args, run.stderr)
    assert not os.path.exists(tmp_path / "checkpoints")  # the probe never creates a directory
