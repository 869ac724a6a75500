"""Hugging Face checkpoints in and out: `load_pretrained` and `save_pretrained`.

Loading streams each parameter straight onto its target sharding: for one device shard at
a time we read only the rows of the HF tensors that shard needs, so the host never holds more than about one tensor beyond what the
devices already own, and on a multi-host pod each process reads only its own shards.
Saving fetches one layer's tensor at a time and writes it straight into the file;
`save_pretrained_from` writes parameters that are read block by block (from a checkpoint
on disk, or `param_reader`'s HF files), in row pieces, never holding a whole tensor.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

from jaxscaffold.models import safetensors_io as st
from jaxscaffold.models.config import MODEL_TYPES, Qwen3Config
from jaxscaffold.models.qwen3 import layer_param_names, param_shapes, param_shardings
from jaxscaffold.models.sharding import DEFAULT_RULES, ShardingRules, check_divisible

log = logging.getLogger(__name__)

_WEIGHT_DTYPES = ("float32", "bfloat16", "float16", "float64")  # HF tensors loaded as parameters

MAX_SHARD_BYTES = 5 * 1024**3
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json", "tokenizer.model",
)
# Qwen3's own token ids (Qwen2.5's are the same), written to generation_config.json.
BOS_ID, EOS_IDS, PAD_ID = 151643, (151645, 151643), 151643


@dataclass(frozen=True)
class SpecialTokens:
    """The ids an exported config.json and generation_config.json name (transformers'
    `generate` stops at `eos`): Qwen3's by default; a model on other words (a testbed's
    vocabulary) passes its tokenizer's, `SpecialTokens.of(tokenizer)`."""
    bos: int = BOS_ID
    eos: tuple[int, ...] = EOS_IDS
    pad: int = PAD_ID

    @classmethod
    def of(cls, tokenizer) -> SpecialTokens:
        """Qwen3's roles on `tokenizer`'s ids: <|endoftext|> begins and pads, `eos_ids` end."""
        end = tokenizer.token_id("<|endoftext|>")
        return cls(bos=end, eos=tuple(tokenizer.eos_ids), pad=end)

    @property
    def ids(self) -> tuple[int, ...]:
        return (self.bos, self.pad, *self.eos)


def special_token_fields(config: Qwen3Config, tokens: SpecialTokens | None) -> dict:
    """bos/eos/pad ids of the HF configs. Given `tokens` must lie in the vocabulary
    (ValueError: an HF `generate` would never stop). None: Qwen3's where the vocabulary holds
    them, else none named, never ids outside it."""
    if tokens is None:
        if config.ids_outside_vocabulary(SpecialTokens().ids):
            return {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
        tokens = SpecialTokens()
    elif outside := config.ids_outside_vocabulary(tokens.ids):
        raise ValueError(f"special token ids {outside} are outside the model's vocabulary of "
                         f"{config.vocab_size}: pass tokens=SpecialTokens.of(tokenizer)")
    return {"bos_token_id": tokens.bos, "eos_token_id": list(tokens.eos), "pad_token_id": tokens.pad}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the problem."""


# ----------------------------------------------------------------------------- config.json


# HF class names per model_type: (causal LM, bare backbone / embedder).
_ARCHITECTURES = {"qwen3": ("Qwen3ForCausalLM", "Qwen3Model"), "qwen2": ("Qwen2ForCausalLM", "Qwen2Model")}


def config_from_hf(hf: dict, source: str = "config.json", **overrides) -> Qwen3Config:
    """Our config from an HF config.json dict (transformers 4.x or 5.x form) of a Qwen3 or a
    Qwen2 / Qwen2.5 (model_type "qwen2") dense model."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        arch = ", ".join(hf.get("architectures") or []) or "none given"
        raise CheckpointError(
            f"{source}: unsupported architecture model_type={model_type!r} ({arch}); "
            "jaxscaffold loads Qwen3 and Qwen2.5 dense models (model_type 'qwen3' or 'qwen2')")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"{source}: unsupported RoPE scaling {rope_type!r} (only 'default')")
    theta = rope.get("rope_theta", hf.get("rope_theta", 1_000_000.0))
    # Qwen2's q/k/v biases are fixed by its architecture (no attention_bias field); a Qwen3 with
    # attention_bias would also bias o, which we do not implement.
    checks = [("hidden_act", "silu"), ("use_sliding_window", False)]
    checks += [("attention_bias", False)] if model_type == "qwen3" else []
    for key, ok in checks:
        if hf.get(key, ok) != ok:
            raise CheckpointError(f"{source}: unsupported {key}={hf[key]!r} (expected {ok!r})")
    layer_types = hf.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise CheckpointError(f"{source}: unsupported layer_types {sorted(set(layer_types))} (only full_attention)")
    causal_lm, backbone = _ARCHITECTURES[model_type]
    archs = hf.get("architectures") or [causal_lm]
    try:
        fields = dict(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
            rope_theta=float(theta), rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            max_position_embeddings=hf.get("max_position_embeddings", 40960),
            is_embedding=archs[0] == backbone, model_type=model_type,
        )
    except KeyError as e:
        raise CheckpointError(f"{source}: missing field {e.args[0]!r}") from None
    fields.update(overrides)
    return Qwen3Config(**fields)


def config_to_hf(config: Qwen3Config, dtype: str, tokens: SpecialTokens | None = None) -> dict:
    """An HF config.json dict readable by transformers 4.x and 5.x (`tokens`: as
    `special_token_fields`)."""
    c = config
    special = special_token_fields(c, tokens)
    torch_dtype = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}[dtype]
    causal_lm, backbone = _ARCHITECTURES[c.model_type]
    out = {
        "architectures": [backbone if c.is_embedding else causal_lm],
        "model_type": c.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim, "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,  # transformers 4.x
        "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"},  # 5.x
        "rope_scaling": None, "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "sliding_window": None, "max_window_layers": c.num_layers, "initializer_range": 0.02,
        "use_cache": True, "bos_token_id": special["bos_token_id"],
        "eos_token_id": special["eos_token_id"][0] if special["eos_token_id"] else None,
        "torch_dtype": torch_dtype, "dtype": torch_dtype,
    }
    if c.model_type == "qwen2":
        del out["attention_bias"]  # not a Qwen2 field: its q/k/v biases are fixed
    return out


# ----------------------------------------------------------------------------- name mapping


@dataclass(frozen=True)
class _Param:
    """How one of our parameters is made of HF tensors."""

    path: tuple[str, ...]  # key path in our params dict
    hf_name: str  # HF tensor name, with `{i}` for the layer index when stacked
    transpose: bool  # ours = hf.T (torch Linear weights are [out, in])
    stacked: bool


# Our layer parameter -> (HF tensor name in a layer, transposed); `qwen3.layer_param_names`
# says which a model type has.
_LAYER_PARAMS = {
    "attn_norm": ("input_layernorm.weight", False),
    "q": ("self_attn.q_proj.weight", True),
    "k": ("self_attn.k_proj.weight", True),
    "v": ("self_attn.v_proj.weight", True),
    "o": ("self_attn.o_proj.weight", True),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "gate": ("mlp.gate_proj.weight", True),
    "up": ("mlp.up_proj.weight", True),
    "down": ("mlp.down_proj.weight", True),
}


def _param_map(config: Qwen3Config) -> list[_Param]:
    # HF's Qwen3Model (the embedder) has no "model." prefix.
    p = "" if config.is_embedding else "model."
    out = [_Param(("embed",), p + "embed_tokens.weight", False, False)]
    for ours in layer_param_names(config):
        hf, t = _LAYER_PARAMS[ours]
        out.append(_Param(("layers", ours), p + "layers.{i}." + hf, t, True))
    out.append(_Param(("final_norm",), p + "norm.weight", False, False))
    if config.has_lm_head:
        out.append(_Param(("lm_head",), "lm_head.weight", True, False))
    return out


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _set(tree, path, value):
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


# ----------------------------------------------------------------------------- loading


def tensor_index(directory: str) -> dict[str, st.TensorInfo]:
    """Every tensor of an HF checkpoint directory (model.safetensors, or the index's shards),
    from their headers alone; a CheckpointError naming the file otherwise."""
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    index_path = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    if os.path.exists(index_path):
        try:
            with open(index_path) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index_path}: unreadable index ({type(e).__name__}: {e})") from None
    elif os.path.exists(single):
        files = ["model.safetensors"]
    else:
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    infos: dict[str, st.TensorInfo] = {}
    for name in files:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            raise CheckpointError(f"{directory}: shard {name} named in the index is missing")
        try:
            infos.update(st.read_header(path))
        except st.SafetensorsError as e:
            raise CheckpointError(str(e)) from None
    return infos


def _read_block(info: st.TensorInfo, transpose: bool, index: tuple[slice, ...]) -> np.ndarray:
    """Our-layout block `index` of one HF tensor, reading only the HF rows it needs."""
    if transpose:  # ours[a, b] = hf[b, a]
        a, b = index
        return st.read_block(info, b, a).T
    return st.read_block(info, index[0], index[1] if len(index) > 1 else None)


def _dtype_name(dtype) -> str:
    """"bfloat16", jnp.bfloat16 or np.float32 alike -> the dtype's name (what configs hold)."""
    try:
        name = jnp.dtype(dtype).name
    except TypeError:
        name = None
    if name not in ("float32", "bfloat16", "float16"):
        raise CheckpointError(f"unsupported parameter dtype {dtype!r} (float32, bfloat16 or float16)")
    return name


def load_pretrained(path: str, *, dtype: str = "float32", mesh=None,
                    rules: ShardingRules = DEFAULT_RULES, **config_overrides: Any):
    """Loads a local HF Qwen3 or Qwen2.5 directory as `(config, params)`.

    Args:
      path: a directory with config.json and safetensors weights (single file or sharded
        with `model.safetensors.index.json`).
      dtype: parameter dtype on device (`config.param_dtype`): a name or a dtype object.
      mesh: place parameters on this mesh under `rules`; default: the first device.
      config_overrides: execution options for the config (compute_dtype, scan_layers, ...).
    """
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint directory not found: {path}")
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise CheckpointError(f"{path}: no config.json")
    try:
        with open(config_path) as f:
            hf_config = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise CheckpointError(f"{config_path}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{config_path}: a JSON {type(hf_config).__name__}, not an object")
    dtype = _dtype_name(dtype)
    infos = tensor_index(path)
    overrides = dict(param_dtype=dtype, **config_overrides)
    if "is_embedding" not in overrides and "model.embed_tokens.weight" not in infos and "embed_tokens.weight" in infos:
        overrides["is_embedding"] = True  # a Qwen3Model checkpoint saved without the prefix
    config = config_from_hf(hf_config, source=config_path, **overrides)

    shapes = param_shapes(config)
    if mesh is None:
        shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), shapes)
    else:
        shardings = param_shardings(config, mesh, rules)
    used, params, nonfinite = set(), {}, set()
    for p in _param_map(config):
        target: jax.ShapeDtypeStruct = _get(shapes, p.path)
        sharding = _get(shardings, p.path)
        names = [p.hf_name.format(i=i) for i in range(config.num_layers)] if p.stacked else [p.hf_name]
        layer_shape = target.shape[1:] if p.stacked else target.shape
        hf_shape = tuple(reversed(layer_shape)) if p.transpose else tuple(layer_shape)
        for name in names:
            if name not in infos:
                raise CheckpointError(f"{path}: missing tensor {name}")
            if infos[name].shape != hf_shape:
                raise CheckpointError(
                    f"{path}: tensor {name} has shape {list(infos[name].shape)}, "
                    f"config.json implies {list(hf_shape)}")
            if infos[name].dtype.name not in _WEIGHT_DTYPES:
                # An integer (or float8) tensor is quantised or not a weight: a cast would load garbage.
                raise CheckpointError(f"{path}: tensor {name} is {infos[name].dtype.name} (a parameter is "
                                      f"one of {', '.join(_WEIGHT_DTYPES)})")
        used.update(names)
        if mesh is not None:
            check_divisible(target.shape, sharding, "/".join(p.path))
        np_dtype = np.dtype(jnp.dtype(dtype))

        def callback(index, p=p, names=names, np_dtype=np_dtype):
            if not p.stacked:
                out = _read_block(infos[names[0]], p.transpose, index).astype(np_dtype, copy=False)
            else:
                layers = range(len(names))[index[0]]
                first = _read_block(infos[names[layers[0]]], p.transpose, index[1:])
                out = np.empty((len(layers),) + first.shape, np_dtype)  # filled in place: no stack copy
                out[0] = first
                for j, i in enumerate(layers[1:], 1):
                    out[j] = _read_block(infos[names[i]], p.transpose, index[1:])
            # Checked on the host as each block streams in: no program to compile, one block's temporary.
            if not np.isfinite(out).all():
                nonfinite.add(p.hf_name.format(i="*") if p.stacked else p.hf_name)
            return out

        _set(params, p.path, _place(target.shape, sharding, callback))
    unused = sorted(set(infos) - used - {"lm_head.weight"})
    if unused:
        log.warning("%s: %d tensors not used by the model, e.g. %s", path, len(unused), unused[:3])
    if nonfinite:
        bad = sorted(nonfinite)
        raise CheckpointError(f"{path}: non-finite values (NaN or inf) in {len(bad)} parameter(s), e.g. "
                              f"{', '.join(bad[:3])}")
    return config, params


def param_reader(directory: str, config: Qwen3Config):
    """`read_block(path, index)`: our-layout block `params[path][index]` of an HF checkpoint
    (index: a layer number for stacked parameters, then slices), reading only the rows it
    needs; in the file's dtype. The reader `save_pretrained_from` takes."""
    infos = tensor_index(directory)
    by_path = {p.path: p for p in _param_map(config)}
    shapes = param_shapes(config)

    def read_block(path: tuple[str, ...], index: tuple) -> np.ndarray:
        p = by_path[path]
        name, rest = (p.hf_name.format(i=index[0]), index[1:]) if p.stacked else (p.hf_name, index)
        if name not in infos:
            raise CheckpointError(f"{directory}: missing tensor {name}")
        ndim = len(_get(shapes, path).shape) - (1 if p.stacked else 0)
        return _read_block(infos[name], p.transpose, tuple(rest) + (slice(None),) * (ndim - len(rest)))

    return read_block


def _place(shape, sharding, read_block):
    """A global array built shard by shard: each device's block is read, copied to its
    device and dropped before the next is read (so at most one block is on the host;
    `jax.make_array_from_callback` would hold all of this process's blocks at once)."""
    index_map = sharding.addressable_devices_indices_map(shape)
    arrays = [jax.device_put(read_block(index), device) for device, index in index_map.items()]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


# ----------------------------------------------------------------------------- saving


def _host(x) -> np.ndarray:
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


@dataclass(frozen=True)
class _Tensor:
    """One HF tensor of the export: which of our parameters (and layer) it is."""

    name: str
    path: tuple[str, ...]
    layer: int | None  # the index into a stacked parameter's layer axis
    transpose: bool
    shape: tuple[int, ...]  # the HF shape


def _tensors(config: Qwen3Config) -> list[_Tensor]:
    """Every HF tensor of `config`'s model, in file order."""
    shapes, out = param_shapes(config), []
    for p in _param_map(config):
        ours = _get(shapes, p.path).shape
        layer_shape = ours[1:] if p.stacked else ours
        shape = tuple(reversed(layer_shape)) if p.transpose else tuple(layer_shape)
        for i in range(config.num_layers) if p.stacked else [None]:
            out.append(_Tensor(p.hf_name.format(i=i), p.path, i, p.transpose, shape))
    return out


def save_pretrained(path: str, config: Qwen3Config, params: dict, tokenizer_dir: str | None = None,
                    *, dtype: str | None = None, max_shard_bytes: int = MAX_SHARD_BYTES,
                    tokens: SpecialTokens | None = None) -> None:
    """Writes an HF directory loadable by `transformers.AutoModelForCausalLM.from_pretrained`
    (`AutoModel` for an embedding model, in the `Qwen3Model` / `Qwen2Model` layout).

    Tensors are fetched and written one at a time, into safetensors shards of at most
    `max_shard_bytes` (with an index when there are several). `dtype` defaults to the
    parameters' dtype. `tokens`: the ids the configs name (`special_token_fields`; a model on
    other words passes its tokenizer's). On multi-host every process must call it; process 0
    writes.
    """
    def produce(t: _Tensor):
        arr = _get(params, t.path)
        x = _host(arr if t.layer is None else arr[t.layer])
        return x.T if t.transpose else x

    _write_dir(path, config, produce, tokenizer_dir, dtype=dtype, max_shard_bytes=max_shard_bytes,
               tokens=tokens, writer=jax.process_index() == 0)


def save_pretrained_from(path: str, config: Qwen3Config, read_block, tokenizer_dir: str | None = None, *,
                         dtype: str | None = None, max_shard_bytes: int = MAX_SHARD_BYTES,
                         piece_bytes: int = 32 * 2**20, tokens: SpecialTokens | None = None) -> None:
    """`save_pretrained` of parameters that are read, not held: `read_block(path, index)`
    returns our-layout block `params[path][index]` (index: a layer number for stacked
    parameters, then slices) as a host array. Each HF tensor is written in row pieces of about
    `piece_bytes`, so the host holds one piece at a time (a reader over a checkpoint on disk
    streams it into the files). One process writes; no collectives."""
    def produce(t: _Tensor):
        row_bytes = max(1, int(np.prod(t.shape[1:], dtype=np.int64))) * 4  # as f32: the widest read
        step = max(1, piece_bytes // row_bytes)
        for r in range(0, t.shape[0], step):
            rows = slice(r, min(r + step, t.shape[0]))
            index = (slice(None), rows) if t.transpose else (rows,)  # ours[:, r] is HF row r when transposed
            block = read_block(t.path, index if t.layer is None else (t.layer, *index))
            yield block.T if t.transpose else block

    _write_dir(path, config, produce, tokenizer_dir, dtype=dtype, max_shard_bytes=max_shard_bytes, tokens=tokens,
               writer=True)


def _shard_names(count: int) -> list[str]:
    """The safetensors file names of an HF directory of `count` shards."""
    return ["model.safetensors"] if count == 1 else \
        [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)]


def _write_dir(path: str, config: Qwen3Config, produce, tokenizer_dir: str | None, *, dtype: str | None,
               max_shard_bytes: int, tokens: SpecialTokens | None, writer: bool) -> None:
    """The HF directory with `produce(tensor)` giving each tensor (or its row pieces) in turn;
    a non-writer process only produces (taking part in the gathers)."""
    special = special_token_fields(config, tokens)  # its ValueError before any file is written
    if writer and special["eos_token_id"] is None:
        log.warning("%s: a vocabulary of %d holds no Qwen3 special ids, so its configs name no bos/eos/pad "
                    "(pass tokens=SpecialTokens.of(tokenizer))", path, config.vocab_size)
    dtype = dtype or config.param_dtype
    np_dtype = np.dtype(jnp.dtype(dtype))
    specs = [st.TensorSpec(t.name, t.shape, np_dtype, lambda t=t: produce(t)) for t in _tensors(config)]
    shards, current, size = [], [], 0
    for s in specs:
        if current and size + s.nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(s)
        size += s.nbytes
    shards.append(current)

    if writer:
        os.makedirs(path, exist_ok=True)
    names = _shard_names(len(shards))
    for name, shard in zip(names, shards):
        if writer:
            st.write_file(os.path.join(path, name), shard)
        else:  # still take part in the collective gathers
            for s in shard:
                s.produce()
    if not writer:
        return
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(s.nbytes for s in specs)},
                 "weight_map": {s.name: n for n, shard in zip(names, shards) for s in shard}}
        _write_json(os.path.join(path, "model.safetensors.index.json"), index)
    _write_json(os.path.join(path, "config.json"), config_to_hf(config, dtype, tokens))
    _write_json(os.path.join(path, "generation_config.json"), special)
    if tokenizer_dir is not None:
        if not os.path.isdir(tokenizer_dir):
            raise CheckpointError(f"tokenizer directory not found: {tokenizer_dir}")
        for fname in TOKENIZER_FILES:
            src = os.path.join(tokenizer_dir, fname)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(path, fname))


def _write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
