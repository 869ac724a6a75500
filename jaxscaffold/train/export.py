"""Training checkpoint -> Hugging Face directory, verified by reloading with transformers.

The export reads the parameters alone, never the optimizer state, block by block straight
from the checkpoint's storage (`Checkpointer.arrays`) into the safetensors files
(`hf_io.save_pretrained_from`): the host holds a few pieces of one tensor at a time,
whatever the model's size. A LoRA run's merged weights stream too when the base is an HF
directory (each block of the base plus its adapters' product); a preset's random base is
rebuilt in memory (presets are for tests). The transformers check (`verify`) holds the whole
model twice (ours and transformers'): leave it off at scale.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from jaxscaffold import config as config_lib
from jaxscaffold.models import hf_io, hub, peft_io, qwen3
from jaxscaffold.models import lora as lora_lib
from jaxscaffold.models.tokenizer import cached_hf_tokenizer_dir
from jaxscaffold.train.checkpoint import (
    CHUNK_BYTES,
    CheckpointCorrupt,
    Checkpointer,
    find_params,
)
from jaxscaffold.train.job import base_dtype, build_model, lora_config, model_config
from jaxscaffold.train.vocabularies import word_tokenizer


def _model_config(cfg):
    """The run's architecture (its config.json or preset; no weight is read), as the export
    writes it: the parameters' dtype, f32 compute."""
    typed = config_lib.typed(cfg)
    return model_config(typed).replace(param_dtype=typed.model.param_dtype, compute_dtype="float32")


def saved_config(ckpt: Checkpointer, step: int) -> ConfigDict:
    """The run config a checkpoint step was saved with (one CheckpointCorrupt line if it does
    not read back: `Checkpointer.restore_extra`)."""
    return config_lib.saved(ckpt.restore_extra(step)["config"])


def export_checkpoint(checkpoint: str, out: str, *, step: int | None = None, dtype: str | None = None,
                      peft_out: str | None = None, verify: bool = True,
                      max_shard_bytes: int = hf_io.MAX_SHARD_BYTES) -> dict:
    """Writes the parameters of a run's checkpoint as an HF directory with a tokenizer; with
    `verify`, reloads it with transformers and compares logits (else the report's
    max_abs_logit_diff is None).

    `checkpoint`: a run's out_dir (its full and params-only checkpoints: `step`, default the
    newest, is looked up in both), or its checkpoints/ or params/ directory.

    A LoRA run's checkpoint holds the adapters alone: the export is the base (rebuilt from the
    run's config: its HF checkpoint, or its seeded preset init) merged with them, in full;
    `peft_out` also writes the adapters as a PEFT directory (`peft.PeftModel.from_pretrained`
    loads it onto the base)."""
    directory, step = find_params(checkpoint, step)
    ckpt = Checkpointer(directory, async_save=False, reader=True)
    try:
        cfg = saved_config(ckpt, step)
        config = _model_config(cfg)
        lora = lora_config(None if cfg.get("lora") is None else config_lib.Lora(**cfg.lora))
        if peft_out and lora is None:
            raise ValueError(f"{directory}: a PEFT adapter export needs a LoRA run (config.lora.rank > 0)")
        # Pieces and the decoded-chunk cache are small against a shard: the host's peak is one
        # shard file's fraction (measured: tests/train/test_export.py).
        piece = max(2**20, min(32 * 2**20, max_shard_bytes // 16))
        arrays = ckpt.arrays(step, cache_bytes=max(2**20, min(2 * CHUNK_BYTES, max_shard_bytes // 8)))
        typed = config_lib.typed(cfg)
        read = _trained(arrays) if lora is None else _merged(typed, config, lora, arrays)
        vocabulary = cfg.model.get("vocabulary")  # a testbed's words: its own tokenizer and ids, not Qwen's
        named = cfg.model.tokenizer or cfg.model.hf_path  # a directory or a hub id
        tokenizer_dir = None if vocabulary else (hub.resolve(named) if named else str(cached_hf_tokenizer_dir()))
        words = word_tokenizer(vocabulary) if vocabulary else None
        tokens = hf_io.SpecialTokens() if words is None else hf_io.SpecialTokens.of(words)
        hf_io.save_pretrained_from(out, config, read, tokenizer_dir=tokenizer_dir, dtype=dtype,
                                   max_shard_bytes=max_shard_bytes, piece_bytes=piece, tokens=tokens)
        if words is not None:
            words.save_hf(out)
        if peft_out:
            adapters = {t: {k: arrays.read(("params", t, k)) for k in ("a", "b")} for t in lora.targets}
            peft_io.save_peft_adapter(peft_out, config, lora, adapters,
                                      base_model_name_or_path=cfg.model.hf_path, dtype=dtype or "float32")
        params = _policy_params(ckpt, step, typed, config, lora) if verify else None
    finally:
        ckpt.close()
    return {"step": step, "out": out, "max_abs_logit_diff": None if params is None else check(out, config, params)}


def _trained(arrays):
    """Blocks of a full fine-tuning run's parameters, as saved."""
    return lambda path, index: arrays.read(("params", *path), index)


def _merged(cfg, config, lora, arrays):
    """Blocks of a LoRA run's merged weights, as `lora.merge` computes them: the base in
    `lora.base_dtype` (as the run held it), a target W + (alpha / r) a @ b summed in f32."""
    if cfg.model.hf_path:
        base_read = hf_io.param_reader(hub.resolve(cfg.model.hf_path), config)
    else:  # a preset's seeded init, in memory (presets are small)
        _, base = build_model(cfg, None)
        base_read = lambda path, index: np.asarray(_get(base, path)[index])
    held = np.dtype(jnp.dtype(base_dtype(cfg)))

    def read(path, index):
        w = base_read(path, index).astype(held, copy=False)
        if path[0] != "layers" or path[1] not in lora.targets:
            return w
        layer, rows, cols = tuple(index) + (slice(None),) * (3 - len(index))
        a = arrays.read(("params", path[1], "a"), (layer, rows, slice(None)))
        b = arrays.read(("params", path[1], "b"), (layer, slice(None), cols))
        d = np.asarray(lora_lib.delta({path[1]: {"a": a[None], "b": b[None]}}, lora, path[1])[0])
        return w.astype(d.dtype) + d

    return read


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _policy_params(ckpt, step, cfg, config, lora) -> dict:
    """The trained policy's full parameters in memory (for `check`): the checkpoint's
    parameters alone (Orbax's partial restore), merged with the base for LoRA."""
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shapes = qwen3.param_shapes(config) if lora is None else lora_lib.adapter_shapes(config, lora, cfg.model.param_dtype)
    target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), shapes)
    params = ckpt.read_params(target, step)
    if lora is None:
        return params
    _, base = build_model(cfg, None)
    return lora_lib.merge(base, params, lora)


def read_policy(checkpoint: str, step: int | None = None):
    """(run config, model config, the trained policy's full parameters in memory, step) of a
    run's checkpoint (`checkpoint` as in `export_checkpoint`): the parameters alone, never the
    optimizer state, LoRA's merged with the base; the model config as the export writes it."""
    directory, step = find_params(checkpoint, step)
    ckpt = Checkpointer(directory, async_save=False, reader=True)
    try:
        cfg = config_lib.typed(saved_config(ckpt, step))
        config = _model_config(cfg)
        params = _policy_params(ckpt, step, cfg, config, lora_config(cfg.lora))
    finally:
        ckpt.close()
    return cfg, config, params, step


def check(out: str, config, params, seq_len: int = 16) -> float:
    """Max |logits(ours) - logits(transformers reload)| on a random batch."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (2, seq_len))
    with torch.no_grad():
        ref = model(input_ids=torch.as_tensor(tokens)).logits.numpy()
    ours = np.asarray(jax.jit(qwen3.forward, static_argnums=1)(params, config.replace(compute_dtype="float32"),
                                                              jnp.asarray(tokens)))
    return float(np.max(np.abs(ours - ref)))
