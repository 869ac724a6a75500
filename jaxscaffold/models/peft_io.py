"""LoRA adapters as a PEFT adapter directory: `peft.PeftModel.from_pretrained(base, path)` loads
them onto the transformers base model.

The directory holds `adapter_config.json` and `adapter_model.safetensors` with PEFT's saved
names (the adapter name, "default", is dropped on save and put back on load):

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]  = a[i].T
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r] = b[i].T
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxscaffold.models import safetensors_io as st
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.lora import LoraConfig

# Our matrix names -> the transformers Qwen3 module each adapts (its Linear's name).
HF_MODULES = {
    "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
}
ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


def peft_config(lora: LoraConfig, base_model_name_or_path: str = "") -> dict:
    """adapter_config.json: plain LoRA (no dropout, no bias, not rsLoRA) on the targets."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
        "target_modules": sorted(HF_MODULES[t].split(".")[-1] for t in lora.targets),
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
        "modules_to_save": None, "init_lora_weights": True, "inference_mode": True,
        "base_model_name_or_path": base_model_name_or_path,
    }


def _host(x) -> np.ndarray:
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def save_peft_adapter(path: str, config: Qwen3Config, lora: LoraConfig, adapters: dict, *,
                      base_model_name_or_path: str = "", dtype: str = "float32") -> None:
    """Writes `adapters` (`models.lora` layout) as a PEFT LoRA directory for the transformers
    Qwen3ForCausalLM of `config`. On multi-host every process must call it; process 0 writes."""
    if config.is_embedding:
        raise ValueError("PEFT adapters are written for a causal LM, not an embedding model")
    np_dtype = np.dtype(jnp.dtype(dtype))
    host = {t: {k: _host(v) for k, v in adapters[t].items()} for t in lora.targets}
    if jax.process_index() != 0:
        return
    specs = []
    for i in range(config.num_layers):
        for t in lora.targets:
            prefix = f"base_model.model.model.layers.{i}.{HF_MODULES[t]}"
            a_T, b_T = host[t]["a"][i].T, host[t]["b"][i].T  # [r, in], [out, r]
            specs.append(st.TensorSpec(f"{prefix}.lora_A.weight", a_T.shape, np_dtype, lambda x=a_T: x))
            specs.append(st.TensorSpec(f"{prefix}.lora_B.weight", b_T.shape, np_dtype, lambda x=b_T: x))
    os.makedirs(path, exist_ok=True)
    st.write_file(os.path.join(path, ADAPTER_FILE), specs)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(peft_config(lora, base_model_name_or_path), f, indent=2)
        f.write("\n")
