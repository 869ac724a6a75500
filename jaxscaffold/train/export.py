"""Training checkpoint -> Hugging Face directory, verified by reloading with transformers."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from jaxscaffold import config as config_lib
from jaxscaffold.models import config as model_config_lib
from jaxscaffold.models import hf_io, peft_io, qwen3
from jaxscaffold.models import lora as lora_lib
from jaxscaffold.models.tokenizer import cached_hf_tokenizer_dir
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state
from jaxscaffold.train.checkpoint import CheckpointCorrupt, Checkpointer, CheckpointNotFound
from jaxscaffold.train.job import build_model, lora_config


def _model_config(cfg) -> model_config_lib.Qwen3Config:
    m = cfg.model
    execution = dict(param_dtype=m.param_dtype, compute_dtype="float32", scan_layers=m.scan_layers)
    if m.hf_path:
        config, _ = hf_io.load_pretrained(m.hf_path, dtype=m.param_dtype)  # architecture only
        return config.replace(**execution)
    if m.preset == "tiny":
        return model_config_lib.tiny(**execution)
    return model_config_lib.preset(m.preset, **execution)


def export_checkpoint(checkpoint: str, out: str, *, step: int | None = None, dtype: str | None = None,
                      peft_out: str | None = None) -> dict:
    """Writes the parameters of a run's checkpoint (its out_dir or its checkpoints/ dir) as an
    HF directory with a tokenizer, then reloads it with transformers and compares logits.

    A LoRA run's checkpoint holds the adapters alone: the export is the base (rebuilt from the
    run's config: its HF checkpoint, or its seeded preset init) merged with them, in full;
    `peft_out` also writes the adapters as a PEFT directory (`peft.PeftModel.from_pretrained`
    loads it onto the base)."""
    directory = checkpoint if os.path.basename(os.path.normpath(checkpoint)) == "checkpoints" \
        else os.path.join(checkpoint, "checkpoints")
    if not os.path.isdir(directory):
        raise CheckpointNotFound(f"no checkpoint directory at {checkpoint} (expected a run's out_dir or its checkpoints/)")
    ckpt = Checkpointer(directory, async_save=False)
    try:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise CheckpointNotFound(f"no checkpoint in {directory}")
        try:
            cfg = ConfigDict(ckpt.restore_extra(step)["config"])
        except (CheckpointNotFound, CheckpointCorrupt):
            raise
        except Exception as e:  # noqa: BLE001  an unreadable JSON document: the step is damaged
            raise CheckpointCorrupt(f"checkpoint step {step} in {directory}: its config does not read back "
                                    f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        config = _model_config(cfg)
        lora = lora_config(None if cfg.get("lora") is None else config_lib.Lora(**cfg.lora))
        if peft_out and lora is None:
            raise ValueError(f"{directory}: a PEFT adapter export needs a LoRA run (config.lora.rank > 0)")
        r = cfg.rl
        opt = OptimizerConfig(lr=r.lr, weight_decay=r.weight_decay, grad_clip=r.grad_clip,
                              warmup_steps=r.warmup_steps).make()
        trained = (lambda: qwen3.init_params(config, jax.random.key(0))) if lora is None else \
            (lambda: jax.tree.map(jnp.zeros_like, lora_lib.adapter_shapes(config, lora, cfg.model.param_dtype)))
        target = jax.eval_shape(lambda: init_train_state(trained(), opt))
        target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                             sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])),
                              target)
        state, _ = ckpt.read(target, step)
    finally:
        ckpt.close()
    tokenizer_dir = cfg.model.tokenizer or cfg.model.hf_path or str(cached_hf_tokenizer_dir())
    params = state.params
    if lora is not None:  # merged in f32 (the base may be bf16): the full weights of the trained policy
        _, base = build_model(config_lib.typed(cfg), None)
        params = lora_lib.merge(base, state.params, lora)
        if peft_out:
            peft_io.save_peft_adapter(peft_out, config, lora, state.params,
                                      base_model_name_or_path=cfg.model.hf_path, dtype=dtype or "float32")
    hf_io.save_pretrained(out, config, params, tokenizer_dir=tokenizer_dir, dtype=dtype)
    return {"step": step, "out": out, "max_abs_logit_diff": verify(out, config, params)}


def verify(out: str, config, params, seq_len: int = 16) -> float:
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
