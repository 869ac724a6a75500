"""How far training moved the weights: ||W_trained - W_base||_F / ||W_base||_F per matrix.

The RWML paper's evidence that world-model RL changes a model less than SFT does: the
relative change of each layer's attention (q, k, v, o) and MLP (gate, up, down) matrices
between two Hugging Face checkpoint directories. Both are read with `safetensors_io`, one
tensor at a time and a block of rows at a time, so comparing two 8B checkpoints needs about
two blocks of host memory, not two checkpoints. `weight_change.py` beside it prints the result.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from jaxscaffold.models import hf_io
from jaxscaffold.models import safetensors_io as st

MODULES = ("q", "k", "v", "o", "gate", "up", "down")
# HF names, with "model." for a causal LM and without for Qwen3Model (an embedder).
_MATRIX = re.compile(r"^(?:model\.)?layers\.(\d+)\.(?:self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")
# config.json fields that must agree for the two checkpoints to be comparable.
ARCHITECTURE_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                       "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
BLOCK_BYTES = 16 * 2**20  # bytes of rows read per step, per checkpoint (float64 copies: 4x that for bf16)


class WeightChangeError(ValueError):
    """Two checkpoints that cannot be compared; the message names the problem."""


def checkpoint_tensors(directory: str) -> dict[str, st.TensorInfo]:
    """Every tensor of an HF checkpoint directory (`hf_io.tensor_index`), or a WeightChangeError."""
    try:
        return hf_io.tensor_index(directory)
    except hf_io.CheckpointError as e:
        raise WeightChangeError(str(e)) from None


def layer_matrices(infos: dict[str, st.TensorInfo]) -> dict[tuple[int, str], str]:
    """(layer, module) -> tensor name for the attention and MLP matrices among `infos`."""
    out = {}
    for name in infos:
        m = _MATRIX.match(name)
        if m:
            out[(int(m.group(1)), m.group(2) or m.group(3))] = name
    return out


def check_architectures(base: str, trained: str) -> None:
    """Refuses two config.json that disagree on the fields of ARCHITECTURE_FIELDS."""
    configs = []
    for d in (base, trained):
        if not os.path.isdir(d):
            raise WeightChangeError(f"{d}: not a directory")
        path = os.path.join(d, "config.json")
        try:
            with open(path) as f:
                configs.append(json.load(f))
        except (OSError, ValueError) as e:
            raise WeightChangeError(f"{path}: unreadable ({e})") from None
    for key in ARCHITECTURE_FIELDS:
        a, b = configs[0].get(key), configs[1].get(key)
        if a != b:
            raise WeightChangeError(f"architectures differ: {key} is {a!r} in {base} and {b!r} in {trained}")


def squared_norms(base: st.TensorInfo, trained: st.TensorInfo, block_bytes: int = BLOCK_BYTES) -> tuple[float, float]:
    """(||trained - base||_F^2, ||base||_F^2) in float64, reading a block of rows at a time."""
    rows = base.shape[0] if base.shape else 1
    row_bytes = max(1, base.nbytes // max(rows, 1))
    step = max(1, block_bytes // row_bytes)
    diff2 = base2 = 0.0
    for r in range(0, rows, step):
        w = st.read_rows(base, r, min(r + step, rows)).astype(np.float64)
        t = st.read_rows(trained, r, min(r + step, rows)).astype(np.float64)
        diff2 += float(np.sum(np.square(t - w)))
        base2 += float(np.sum(np.square(w)))
    return diff2, base2


def relative_change(diff2: float, base2: float) -> float:
    """sqrt(diff2 / base2); 0 when nothing changed, inf when a zero matrix did."""
    if diff2 == 0.0:
        return 0.0
    return float(np.sqrt(diff2) / np.sqrt(base2)) if base2 > 0 else float("inf")


def weight_change(base: str, trained: str) -> dict:
    """The relative change of every layer's attention and MLP matrices from `base` to `trained`:
    {"layers": [{"layer": i, "q": ..., ..., "down": ...}], "mean": {module: mean over layers},
    "overall_mean": mean over all matrices, "overall": ||all changes||_F / ||all base matrices||_F}."""
    check_architectures(base, trained)
    infos_b, infos_t = checkpoint_tensors(base), checkpoint_tensors(trained)
    names_b, names_t = layer_matrices(infos_b), layer_matrices(infos_t)
    if not names_b:
        raise WeightChangeError(f"{base}: no attention or MLP matrices (layers.N.self_attn.q_proj.weight ...)")
    if set(names_b) != set(names_t):
        missing = min(set(names_b) ^ set(names_t))
        raise WeightChangeError(f"the checkpoints hold different matrices (e.g. layer {missing[0]} {missing[1]})")
    layers: dict[int, dict] = {}
    total_diff2 = total_base2 = 0.0
    for (layer, module) in sorted(names_b, key=lambda k: (k[0], MODULES.index(k[1]))):
        b, t = infos_b[names_b[layer, module]], infos_t[names_t[layer, module]]
        if b.shape != t.shape:
            raise WeightChangeError(f"{names_b[layer, module]}: shape {list(b.shape)} in {base}, "
                                    f"{list(t.shape)} in {trained}")
        try:
            diff2, base2 = squared_norms(b, t)
        except st.SafetensorsError as e:
            raise WeightChangeError(str(e)) from None
        total_diff2, total_base2 = total_diff2 + diff2, total_base2 + base2
        layers.setdefault(layer, {"layer": layer})[module] = relative_change(diff2, base2)
    rows = [layers[i] for i in sorted(layers)]
    mean = {m: float(np.mean([r[m] for r in rows if m in r])) for m in MODULES if any(m in r for r in rows)}
    values = [r[m] for r in rows for m in MODULES if m in r]
    return {"base": base, "trained": trained, "layers": rows, "mean": mean,
            "overall_mean": float(np.mean(values)), "overall": relative_change(total_diff2, total_base2)}


def format_table(report: dict) -> str:
    """The per-layer table, the mean per module type and the overall change, as text."""
    modules = [m for m in MODULES if m in report["mean"]]
    lines = ["relative change ||W_trained - W_base||_F / ||W_base||_F",
             f"  base:    {report['base']}", f"  trained: {report['trained']}",
             f"{'layer':>6}" + "".join(f"{m:>11}" for m in modules)]
    for row in report["layers"]:
        lines.append(f"{row['layer']:>6}" + "".join(f"{row[m]:>11.3e}" if m in row else f"{'-':>11}" for m in modules))
    lines.append(f"{'mean':>6}" + "".join(f"{report['mean'][m]:>11.3e}" for m in modules))
    lines.append(f"overall: mean over matrices {report['overall_mean']:.3e}, "
                 f"all matrices together {report['overall']:.3e}")
    return "\n".join(lines)
