"""The run configuration: a typed, validated tree built once from an ml_collections config.

Config files (`configs/*.py`) stay ml_collections ConfigDicts, with their defaults and a
comment per field in `configs/base.py` (and `configs/rwml.py` for the `rwml` section).
`from_configdict` turns one into a `RunConfig` of frozen dataclasses and checks it before
anything is built: unknown fields (with a "did you mean"), missing fields, types, the allowed
values of every enum, ranges and the fields that depend on each other. Workloads receive the
typed tree, never the raw ConfigDict. A problem is a `ConfigError`, a one-line message naming
the field and what it allows.

`parse_overrides` applies command-line overrides (`--config.rl.lr=1e-6`) with the same
checks, parsing each value as its field's type.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from typing import Any, Literal, Mapping, Sequence

from ml_collections import ConfigDict

DTYPES = ("float32", "bfloat16", "float16")


class ConfigError(ValueError):
    """A config field is unknown, missing, mistyped or out of its allowed values (one line)."""


@dataclasses.dataclass(frozen=True)
class Model:
    hf_path: str
    preset: str
    tokenizer: str
    vocabulary: str
    param_dtype: Literal["float32", "bfloat16", "float16"]
    compute_dtype: Literal["float32", "bfloat16", "float16"]
    cache_dtype: Literal["float32", "bfloat16", "float16"]
    scan_layers: bool
    remat_policy: Literal["none", "full", "save_dots"]


@dataclasses.dataclass(frozen=True)
class Mesh:
    data: int
    fsdp: int
    tensor: int
    devices: int
    rollout_devices: int = 0  # the last n of the run's devices sample, the others train (`job.split_devices`)


@dataclasses.dataclass(frozen=True)
class RL:
    algorithm: str
    lr: float
    weight_decay: float
    grad_clip: float
    warmup_steps: int
    ppo_epochs: int
    num_minibatches: int
    micro_batches: int
    kl_coef: float
    entropy_coef: float
    # The reference run's update: mini-batches of rows, old log-probs, TIS, DAPO.
    minibatch_rows: int
    recompute_old_logprobs: bool
    tis_cap: float
    dynamic_sampling_exhausted: Literal["continue", "raise"]
    overlong_buffer: int = 0  # DAPO overlong shaping buffer in tokens; 0: off (the reference)
    group_stats: Literal["trajectory", "row"] = "trajectory"  # what a group's statistics count
    # A run that does not train stops (exit 1): consecutive skipped updates / steps with no row.
    max_bad_steps: int = 3
    max_empty_steps: int = 3
    # Masked importance sampling of stale / mismatched tokens (`rl.losses.Correction`).
    mis: Literal["off", "token", "sequence"] = "off"
    mis_lo: float = 0.5
    mis_hi: float = 2.0
    mis_denominator: Literal["all", "kept"] = "all"  # masked tokens counted in the aggregation, or dropped (verl)


@dataclasses.dataclass(frozen=True)
class Rollout:
    tasks_per_step: int
    group_size: int
    max_turns: int
    max_new_tokens: int
    max_len: int
    temperature: float
    top_p: float
    enable_thinking: bool
    representation: Literal["trajectory", "stepwise"]
    history_window: int
    sampler_devices: int = 0  # a host's sampler mesh: its first n devices (0: all; `multihost.rollout_mesh`)
    max_rows_in_flight: int = 0  # a memory knob: the sampler's slots (`train.waves`)
    lockstep: bool = False  # episodes stepped together turn by turn (the reference); else asynchronous
    decode_chunk: int = 16  # asynchronous: tokens a ready row decodes between admissions
    max_staleness: int = 0  # k > 0: rollouts of the next k steps overlap training (`train.collector`)
    partial: bool = False  # with max_staleness >= 1: running episodes continue under newly published weights


@dataclasses.dataclass(frozen=True)
class Tau2User:
    """tau2's user simulator (`train.user_model`); defaults: configs written before the section."""

    mode: Literal["model", "endpoint", "none"] = "model"
    hf_path: str = ""
    preset: str = ""
    url: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    max_len: int = 8192
    slots: int = 8
    compute_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    enable_thinking: bool = False
    timeout_s: float = 120.0
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Envs:
    train: str
    train_split: str
    eval: str
    eval_split: str
    num_workers: int
    step_timeout_s: float
    env_kwargs: str
    reset_timeout_s: float = 180.0  # a worker silent this long in a reset is restarted
    tau2_user: Tau2User = Tau2User()

    def kwargs(self) -> dict[str, dict]:
        """`env_kwargs` parsed: {env name: constructor kwargs} (validated at load)."""
        return json.loads(self.env_kwargs) if self.env_kwargs else {}


@dataclasses.dataclass(frozen=True)
class Feedback:
    schedule: str
    probability: float
    mode: Literal["group", "rollout", "first_half", "even"]
    switch_step: int
    ag_form: str
    oe_form: str
    bandit_arms: str
    bandit_signal: Literal["informative", "success"]
    bandit_discount: float
    bandit_prior: float

    def arms(self) -> list[str]:
        """The schedule names a "bandit" schedule picks from."""
        return [a.strip() for a in self.bandit_arms.split(",") if a.strip()]


@dataclasses.dataclass(frozen=True)
class Eval:
    every: int
    tasks: int
    max_turns: int
    max_len: int
    at_start: bool
    batch_size: int


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    every: int
    keep: int
    allow_change: str = ""  # (default: configs written before the field load) fields a resume may change
    params_only_every: int = 0  # (defaults: configs written before the fields load) params-only saves
    params_only_keep: int = 0

    def allowed_changes(self) -> list[str]:
        """The dotted fields `allow_change` lists."""
        return [a.strip() for a in self.allow_change.split(",") if a.strip()]


@dataclasses.dataclass(frozen=True)
class Export:
    """The HF export at the end of a run (`train.export.export_checkpoint`)."""

    at_end: bool = False
    dir: str = ""
    dtype: Literal["", "float32", "bfloat16", "float16"] = ""
    verify: bool = False


@dataclasses.dataclass(frozen=True)
class Logging:
    verbose: bool = False
    wandb: Literal["off", "offline", "online"] = "off"
    wandb_project: str = "jaxscaffold"


@dataclasses.dataclass(frozen=True)
class Memory:
    check_at_start: bool = True
    hbm_gb: float = 0.0


@dataclasses.dataclass(frozen=True)
class Lora:
    rank: int
    alpha: float
    targets: str
    base_dtype: Literal["float32", "bfloat16", "float16"]

    def target_names(self) -> tuple[str, ...]:
        """`targets` parsed: the adapted matrices' names."""
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())


@dataclasses.dataclass(frozen=True)
class Filter:
    enabled: bool
    sft_share: float
    sft_steps: int
    sft_batch: int
    sft_lr: float
    samples: int
    tau_d: float
    tau_easy: float
    p_keep_easy: float


@dataclasses.dataclass(frozen=True)
class RWML:
    objective: Literal["rl", "sft"]
    collect_policy: Literal["model", "explore"]
    collect_tasks: int
    rollouts_per_task: int
    collect_max_turns: int
    collect_temperature: float
    explore_gold_prob: float
    heldout_share: float
    history_window: int
    max_obs_chars: int
    reward: Literal["embedding", "embedding_facts", "lines", "judge_binary", "judge_continuous"]
    embedder: Literal["minilm", "qwen3"]
    embedder_path: str
    embedder_batch: int
    judge_path: str
    tau_d: float
    export_dir: str
    filter: Filter
    epochs: float = 2.0  # 0: `steps` as configured


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One run: what `launch/tpu_train.py` and `jaxscaffold.train` execute."""

    job: Literal["rl", "rwml"]
    seed: int
    out_dir: str
    steps: int
    model: Model
    mesh: Mesh
    rl: RL
    rollout: Rollout
    envs: Envs
    feedback: Feedback
    eval: Eval
    checkpoint: Checkpoint
    logging: Logging = Logging()  # (a default: configs written before the section load)
    memory: Memory = Memory()  # the start-up memory check (a default, as `logging`)
    export: Export = Export()  # (a default: configs written before the section load)
    rwml: RWML | None = None  # the world-model section (configs/rwml.py); only `job = "rwml"` reads it
    lora: Lora | None = None  # LoRA adapters (configs/base.py); None (configs written before it): off

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable values (checkpoints keep the config they were written with)."""
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- building


def from_configdict(cd: ConfigDict | Mapping) -> RunConfig:
    """The typed, validated run config of an ml_collections config (or its plain dict form)."""
    d = cd.to_dict() if isinstance(cd, ConfigDict) else dict(cd)
    cfg = _build(RunConfig, d, "")
    _check_finite(cfg)  # before the range checks: NaN passes every comparison
    validate(cfg)
    return cfg


def typed(cfg: RunConfig | ConfigDict | Mapping) -> RunConfig:
    """`cfg` as a checked RunConfig (the public entry points take a ConfigDict too)."""
    return cfg if isinstance(cfg, RunConfig) else from_configdict(cfg)


def replace(cfg: RunConfig, **changes: Any) -> RunConfig:
    """`cfg` with dotted fields changed, checked: `replace(cfg, **{"envs.eval": "letters"})`."""
    d = cfg.to_dict()
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        section = d
        for name in parents:
            section = section[name]
        if leaf not in section:
            raise ConfigError(f"unknown config field {path}")
        section[leaf] = value
    return from_dict(d)


def from_dict(d: Mapping) -> RunConfig:
    """`RunConfig.to_dict`'s inverse (e.g. a checkpoint's config), validated."""
    return from_configdict(d)


def _build(cls, d: Mapping, path: str):
    if not isinstance(d, Mapping):
        raise ConfigError(f"config.{path.rstrip('.')} must be a section (a ConfigDict), got {d!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in d:
        if key not in fields:
            raise ConfigError(f"unknown config field {path}{key}{_did_you_mean(key, fields)}")
    values = {}
    for name, f in fields.items():
        if name not in d:
            if f.default is not dataclasses.MISSING:
                continue
            raise ConfigError(f"config.{path}{name} is missing (configs start from configs/base.py's get_config())")
        values[name] = _typed(hints[name], d[name], f"{path}{name}")
    return cls(**values)


def _typed(hint, value, path: str):
    """`value` as the field's type, or a ConfigError naming the field, the value and the type."""
    if _is_optional(hint):  # `Section | None`
        if value is None:
            return None
        hint = _optional_of(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path + ".")
    if typing.get_origin(hint) is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(f"config.{path}={value!r} is not one of: {', '.join(allowed)}")
        return value
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, hint)
    if not ok:
        raise ConfigError(f"config.{path}={value!r} must be a {hint.__name__}")
    return value


def _did_you_mean(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else f" (fields: {', '.join(known)})"


# ----------------------------------------------------------------------------- overrides


def parse_overrides(cd: ConfigDict, overrides: Sequence[str]) -> ConfigDict:
    """Applies `path=value` overrides (the `--config.` prefix stripped) to `cd` in place,
    each value parsed as its field's type; unknown paths get a "did you mean"."""
    for item in overrides:
        path, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} has no value: write --config.{path}=VALUE")
        *parents, leaf = path.split(".")
        section, cls, where = cd, RunConfig, ""
        for name in parents:
            hint = _field_hint(cls, name, where)
            if not dataclasses.is_dataclass(hint) or name not in section:
                raise ConfigError(f"config.{where}{name} is not a section")
            section, cls, where = section[name], hint, f"{where}{name}."
        hint = _field_hint(cls, leaf, where)
        if dataclasses.is_dataclass(hint):
            raise ConfigError(f"config.{where}{leaf} is a section: override its fields (--config.{where}{leaf}.FIELD=...)")
        section[leaf] = _parse_value(hint, text, f"{where}{leaf}")
    return cd


def _field_hint(cls, name: str, where: str):
    hints = typing.get_type_hints(cls)
    if name not in hints:
        raise ConfigError(f"unknown config field {where}{name}{_did_you_mean(name, list(hints))}")
    return _optional_of(hints[name]) if _is_optional(hints[name]) else hints[name]


def _is_optional(hint) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _optional_of(hint):
    return next(a for a in typing.get_args(hint) if a is not type(None))


def _parse_value(hint, text: str, path: str):
    if typing.get_origin(hint) is Literal or hint is str:
        return text
    if hint is bool:
        low = text.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ConfigError(f"config.{path}={text!r} must be a bool (true or false)")
    try:
        return hint(text)
    except ValueError:
        raise ConfigError(f"config.{path}={text!r} must be a {hint.__name__}") from None


# ----------------------------------------------------------------------------- checks


def validate(cfg: RunConfig) -> None:
    """Every check that needs more than a field's type: names other modules define, ranges,
    and fields that depend on each other. Raises ConfigError."""
    from jaxscaffold.feedback import enrichers, randomization, schedule
    from jaxscaffold.models import config as model_configs
    from jaxscaffold.rl import presets

    _one_of("rl.algorithm", cfg.rl.algorithm, sorted(presets.PRESETS))
    _range("memory.hbm_gb", cfg.memory.hbm_gb, 0.0)
    if not cfg.model.hf_path:
        _one_of("model.preset", cfg.model.preset.lower(), ["tiny", *model_configs.PRESETS])
        if cfg.model.preset.lower() == "tiny" and cfg.model.preset != "tiny":  # the build knows "tiny" alone
            raise ConfigError(f"config.model.preset={cfg.model.preset!r}: write 'tiny' (lower case)")
    _check_vocabulary(cfg.model)
    f = cfg.feedback
    if f.schedule == "bandit":
        if not f.arms():
            raise ConfigError("config.feedback.bandit_arms names no schedule (comma-separated schedule names)")
        for arm in f.arms():
            _one_of("feedback.bandit_arms", arm, schedule.NAMES)
    else:
        _one_of("feedback.schedule", f.schedule, [*schedule.NAMES, "bandit"])
    assert f.mode in randomization.MODES  # the Literal above mirrors them
    for kind, form in (("ag", f.ag_form), ("oe", f.oe_form)):
        _one_of(f"feedback.{kind}_form", form, enrichers.form_names(kind))
    _check_tasks("envs.train", cfg.envs.train, cfg.envs.train_split)
    _check_tasks("envs.eval", cfg.envs.eval, cfg.envs.eval_split)
    _check_env_kwargs(cfg.envs.env_kwargs)

    _range("steps", cfg.steps, 1)
    if not cfg.out_dir.strip():
        raise ConfigError("config.out_dir is empty: name the run's directory (e.g. runs/my_run)")
    _range("mesh.devices", cfg.mesh.devices, 0)
    for axis in ("data", "fsdp", "tensor"):
        if getattr(cfg.mesh, axis) == 0 or getattr(cfg.mesh, axis) < -1:
            raise ConfigError(f"config.mesh.{axis}={getattr(cfg.mesh, axis)} must be >= 1 (or -1: fill)")
    if [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor].count(-1) > 1:
        raise ConfigError("config.mesh: at most one of data / fsdp / tensor may be -1 (fill)")
    r = cfg.rl
    _range("rl.lr", r.lr, 0.0, strict=True)
    for name in ("weight_decay", "grad_clip", "kl_coef", "entropy_coef"):
        _range(f"rl.{name}", getattr(r, name), 0.0)
    for name in ("warmup_steps",):
        _range(f"rl.{name}", getattr(r, name), 0)
    for name in ("ppo_epochs", "num_minibatches", "micro_batches"):
        _range(f"rl.{name}", getattr(r, name), 1)
    _range("rl.max_bad_steps", r.max_bad_steps, 1)
    _range("rl.max_empty_steps", r.max_empty_steps, 1)
    _check_update(r)
    c = cfg.rollout
    for name in ("tasks_per_step", "group_size", "max_turns", "max_new_tokens"):
        _range(f"rollout.{name}", getattr(c, name), 1)
    _range("rollout.history_window", c.history_window, 0)
    _range("rollout.sampler_devices", c.sampler_devices, 0)
    _range("rollout.max_rows_in_flight", c.max_rows_in_flight, 0)
    _range("rollout.max_staleness", c.max_staleness, 0)
    if c.partial and (c.max_staleness < 1 or c.lockstep):
        raise ConfigError(f"config.rollout.partial needs rollout.max_staleness >= 1 (got {c.max_staleness}) and "
                          f"the asynchronous driver (rollout.lockstep=False): weights change between decode chunks")
    _range("mesh.rollout_devices", cfg.mesh.rollout_devices, 0)
    _range("rollout.decode_chunk", c.decode_chunk, 1)
    if 0 < c.max_rows_in_flight < c.group_size:
        raise ConfigError(f"config.rollout.max_rows_in_flight={c.max_rows_in_flight} must be 0 (all rows at once) "
                          f"or at least rollout.group_size={c.group_size} (a wave holds whole groups)")
    _range("rollout.temperature", c.temperature, 0.0)
    _range("rollout.top_p", c.top_p, 0.0, 1.0, strict=True)
    if c.max_len <= c.max_new_tokens:
        raise ConfigError(f"config.rollout.max_len={c.max_len} must exceed rollout.max_new_tokens={c.max_new_tokens}")
    if cfg.eval.max_len and cfg.eval.max_len <= c.max_new_tokens:
        raise ConfigError(f"config.eval.max_len={cfg.eval.max_len} must be 0 (rollout.max_len) or exceed "
                          f"rollout.max_new_tokens={c.max_new_tokens}")
    _range("feedback.probability", f.probability, 0.0, 1.0)
    _range("feedback.switch_step", f.switch_step, 0)
    _range("feedback.bandit_discount", f.bandit_discount, 0.0, 1.0)
    _range("feedback.bandit_prior", f.bandit_prior, 0.0, strict=True)
    _range("envs.num_workers", cfg.envs.num_workers, 0)
    _range("envs.step_timeout_s", cfg.envs.step_timeout_s, 0.0, strict=True)
    _range("envs.reset_timeout_s", cfg.envs.reset_timeout_s, 0.0, strict=True)
    _range("eval.every", cfg.eval.every, 0)
    _range("eval.tasks", cfg.eval.tasks, 0)
    _range("eval.batch_size", cfg.eval.batch_size, 0)
    _range("eval.max_turns", cfg.eval.max_turns, 1)
    _range("eval.max_len", cfg.eval.max_len, 0)
    _range("checkpoint.every", cfg.checkpoint.every, 1)
    _range("checkpoint.keep", cfg.checkpoint.keep, 1)
    _range("checkpoint.params_only_every", cfg.checkpoint.params_only_every, 0)
    _range("checkpoint.params_only_keep", cfg.checkpoint.params_only_keep, 0)
    _check_run_ux(cfg)
    if cfg.job == "rwml":
        _check_rwml(cfg)
    if cfg.lora is not None:
        _check_lora(cfg)
    _check_tau2_user(cfg)


def _check_lora(cfg: RunConfig) -> None:
    from jaxscaffold.models import lora

    lo = cfg.lora
    _range("lora.rank", lo.rank, 0)
    _range("lora.alpha", lo.alpha, 0.0, strict=True)
    if not lo.target_names():
        raise ConfigError(f"config.lora.targets={lo.targets!r} names no matrix (comma-separated among "
                          f"{', '.join(lora.TARGETS)})")
    for name in lo.target_names():
        _one_of("lora.targets", name, lora.TARGETS)
    if lo.rank and cfg.job != "rl":
        raise ConfigError(f"config.lora.rank={lo.rank}: LoRA trains task RL (job='rl') only, not job={cfg.job!r}")


def _check_update(r: RL) -> None:
    """The mini-batching, old log-prob and TIS fields (one way to say each thing)."""
    _range("rl.minibatch_rows", r.minibatch_rows, 0)
    if r.minibatch_rows and r.num_minibatches != 1:
        raise ConfigError(f"config.rl.minibatch_rows={r.minibatch_rows} sets the mini-batches by rows: leave "
                          f"rl.num_minibatches at 1 (got {r.num_minibatches})")
    _range("rl.overlong_buffer", r.overlong_buffer, 0)
    _range("rl.tis_cap", r.tis_cap, 0.0)
    if r.tis_cap and not r.recompute_old_logprobs:
        raise ConfigError(f"config.rl.tis_cap={r.tis_cap} weights by pi_trainer_old / pi_sampler: it needs "
                          "rl.recompute_old_logprobs=True")
    _range("rl.mis_lo", r.mis_lo, 0.0)
    if r.mis_hi <= r.mis_lo:
        raise ConfigError(f"config.rl.mis_hi={r.mis_hi} must exceed rl.mis_lo={r.mis_lo} (MIS keeps ratios in [lo, hi])")
    if r.mis != "off" and r.mis_denominator == "kept" and not r.recompute_old_logprobs:
        raise ConfigError("config.rl.mis_denominator='kept' counts the tokens MIS keeps before the update: it needs "
                          "rl.recompute_old_logprobs=True")


def _check_run_ux(cfg: RunConfig) -> None:
    """checkpoint.allow_change names fields; logging.wandb needs the (optional) wandb package."""
    fields = set(flat_fields(cfg.to_dict()))
    for name in cfg.checkpoint.allowed_changes():
        if name not in fields:
            raise ConfigError(f"config.checkpoint.allow_change: {name!r} is not a config field"
                              f"{_did_you_mean(name, sorted(fields))}")
    if cfg.logging.wandb != "off":
        import importlib.util
        if importlib.util.find_spec("wandb") is None:
            raise ConfigError(f"config.logging.wandb={cfg.logging.wandb!r} needs the wandb package "
                              "(pip install wandb), or logging.wandb='off'")


def flat_fields(d: Mapping, prefix: str = "") -> dict[str, Any]:
    """A config dict's leaves by dotted name: {"rl.lr": 1e-6, ...} (a None section is a leaf)."""
    out = {}
    for key, value in d.items():
        if isinstance(value, Mapping):
            out.update(flat_fields(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _check_rwml(cfg: RunConfig) -> None:
    w = cfg.rwml
    if w is None:
        raise ConfigError("config.job='rwml' needs the rwml section (start from configs/rwml.py's get_config())")
    for name in ("collect_tasks", "rollouts_per_task", "collect_max_turns", "max_obs_chars", "embedder_batch"):
        _range(f"rwml.{name}", getattr(w, name), 1)
    _range("rwml.history_window", w.history_window, 0)
    _range("rwml.collect_temperature", w.collect_temperature, 0.0)
    _range("rwml.explore_gold_prob", w.explore_gold_prob, 0.0, 1.0)
    _range("rwml.heldout_share", w.heldout_share, 0.0, 1.0, strict=True)
    _range("rwml.epochs", w.epochs, 0.0)
    _range("rwml.tau_d", w.tau_d, 0.0, 2.0, strict=True)
    embedding = w.reward in ("embedding", "embedding_facts")
    if w.embedder == "qwen3" and embedding and not w.embedder_path:
        raise ConfigError("config.rwml.embedder='qwen3' needs rwml.embedder_path (a local Qwen3-Embedding HF dir)")
    if w.reward.startswith("judge_") and not w.judge_path:
        raise ConfigError(f"config.rwml.reward={w.reward!r} needs rwml.judge_path (a local HF chat model dir)")
    p = w.filter
    for name in ("sft_steps", "sft_batch", "samples"):
        _range(f"rwml.filter.{name}", getattr(p, name), 1)
    _range("rwml.filter.sft_share", p.sft_share, 0.0, 1.0, strict=True)
    _range("rwml.filter.sft_lr", p.sft_lr, 0.0, strict=True)
    _range("rwml.filter.tau_d", p.tau_d, 0.0, 2.0, strict=True)
    _range("rwml.filter.tau_easy", p.tau_easy, 0.0, 1.0)
    _range("rwml.filter.p_keep_easy", p.p_keep_easy, 0.0, 1.0)


def _check_vocabulary(m: Model) -> None:
    """A word-level vocabulary is a tokenizer of its own: not with a tokenizer directory."""
    from jaxscaffold.train.vocabularies import VOCABULARIES

    _one_of("model.vocabulary", m.vocabulary, ["", *VOCABULARIES])
    if m.vocabulary and m.tokenizer:
        raise ConfigError(f"config.model.vocabulary={m.vocabulary!r} and config.model.tokenizer={m.tokenizer!r}: "
                          "set one of them")


def _one_of(path: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise ConfigError(f"config.{path}={value!r} is not one of: {', '.join(map(str, allowed))}")


def _range(path: str, value, low, high=None, *, strict: bool = False) -> None:
    """`low <= value <= high` (`low < value` when strict); `high` None: no upper bound. NaN
    is out of every range (it compares false with everything)."""
    below = value <= low if strict else value < low
    if below or (high is not None and value > high) or value != value:
        bound = f"> {low}" if strict else f">= {low}"
        raise ConfigError(f"config.{path}={value!r} must be {bound}" + (f" and <= {high}" if high is not None else ""))


def _check_finite(cfg: RunConfig) -> None:
    """Every float field finite: NaN / inf would pass comparisons (a NaN learning rate trains a
    NaN model; a NaN timeout turns a watchdog off)."""
    for name, value in flat_fields(cfg.to_dict()).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"config.{name}={value!r} must be a finite number")


def _check_tasks(path: str, spec: str, default_split: str) -> None:
    from jaxscaffold.envs import registry
    try:
        entries = [(s.env, s.split or default_split, s.limit) for s in registry.parse_task_spec(spec)]
    except ValueError as e:
        raise ConfigError(f"config.{path}: {e}") from None
    if not entries:
        raise ConfigError(f"config.{path} names no environment (comma-separated names of: {', '.join(registry.ENVS)})")
    for name, split, limit in entries:
        _one_of(f"{path} (environment)", name, list(registry.ENVS))
        try:
            registry.check_split(name, split)
        except ValueError as e:
            raise ConfigError(f"config.{path}: {e}") from None
        if limit is not None and limit < 1:
            raise ConfigError(f"config.{path}: {name}'s task count must be >= 1")


def _check_tau2_user(cfg: RunConfig) -> None:
    """A run with tau2 names its user simulator (or opts out with mode 'none'), in one way."""
    from jaxscaffold.envs import registry
    from jaxscaffold.models import config as model_configs

    u = cfg.envs.tau2_user
    _range("envs.tau2_user.temperature", u.temperature, 0.0)
    _range("envs.tau2_user.top_p", u.top_p, 0.0, 1.0, strict=True)
    for name in ("max_tokens", "slots"):
        _range(f"envs.tau2_user.{name}", getattr(u, name), 1)
    _range("envs.tau2_user.timeout_s", u.timeout_s, 0.0, strict=True)
    if u.max_len <= u.max_tokens:
        raise ConfigError(f"config.envs.tau2_user.max_len={u.max_len} must exceed envs.tau2_user.max_tokens={u.max_tokens}")
    if u.preset:
        _one_of("envs.tau2_user.preset", u.preset.lower(), ["tiny", *model_configs.PRESETS])
    given = [f"{n}={getattr(u, n)!r}" for n in ("hf_path", "preset", "url") if getattr(u, n)]
    if u.mode == "model" and (bool(u.hf_path) == bool(u.preset) or u.url) and given:
        raise ConfigError(f"config.envs.tau2_user.mode='model' serves one model: hf_path or preset, not {' and '.join(given)}")
    if u.mode == "endpoint" and (not u.url.startswith(("http://", "https://")) or u.hf_path or u.preset):
        raise ConfigError(f"config.envs.tau2_user.mode='endpoint' needs url (an OpenAI-compatible base URL, e.g. "
                          f"http://127.0.0.1:8011/v1) and no model: got {', '.join(given) or 'none'}")
    if u.mode == "none" and given:
        raise ConfigError(f"config.envs.tau2_user.mode='none' runs without a user: clear {', '.join(given)}")
    if "user" in cfg.envs.kwargs().get("tau2", {}):
        raise ConfigError("config.envs.env_kwargs sets tau2's user: configure it in envs.tau2_user instead "
                          "(mode='endpoint' with url, or mode='model' with hf_path / preset)")
    for field in ("train", "eval"):
        spec = getattr(cfg.envs, field)
        if u.mode == "model" and not given and "tau2" in {s.env for s in registry.parse_task_spec(spec)}:
            raise ConfigError(f"config.envs.{field}={spec!r} runs tau2, whose user simulator needs a chat model: set "
                              "envs.tau2_user.hf_path (a local HF chat model dir) or .preset ('tiny': tests), or "
                              "mode='endpoint' with url; mode='none' runs without a user (telecom solo; retail / "
                              "airline messages unanswered)")


def _check_env_kwargs(text: str) -> None:
    from jaxscaffold.envs import registry
    if not text:
        return
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"config.envs.env_kwargs is not JSON ({e}): {text!r}") from None
    if not isinstance(kwargs, dict) or not all(isinstance(v, dict) for v in kwargs.values()):
        raise ConfigError(f"config.envs.env_kwargs must map env names to objects of kwargs: {text!r}")
    for name in kwargs:
        _one_of("envs.env_kwargs (environment)", name, list(registry.ENVS))


# ----------------------------------------------------------------------------- files


def split_variant(value: str) -> tuple[str, str | None]:
    """("pilot.py", "ag_early") of "pilot.py:ag_early" (ml_collections' config string), and
    (value, None) without a variant."""
    path, sep, variant = value.rpartition(":")
    return (path, variant) if sep and path and variant.isidentifier() else (value, None)


def load_file(path: str) -> ConfigDict:
    """The ConfigDict of a config file's `get_config()`, or of `get_config(variant)` for
    "file.py:variant" (a ConfigError if it has none, or no such variant)."""
    import importlib.util
    import os
    path, variant = split_variant(path)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f"jaxscaffold_config_{name}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path} is not a Python config file")
    module = importlib.util.module_from_spec(spec)
    try:  # the user's own file: its error is one line naming it (and the line, for a syntax error)
        spec.loader.exec_module(module)
        if not hasattr(module, "get_config"):
            raise ConfigError(f"{path} defines no get_config()")
        if variant is None:
            cd = module.get_config()
        else:
            variants = list(getattr(module, "VARIANTS", ()))
            if variant not in variants:
                close = difflib.get_close_matches(variant, variants, n=1)
                raise ConfigError(f"{path} has no variant {variant!r} (variants: {', '.join(variants) or 'none'})"
                                  + (f"; did you mean {close[0]}?" if close else ""))
            cd = module.get_config(variant)
    except ConfigError:
        raise
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: syntax error ({e.msg})") from None
    except Exception as e:  # noqa: BLE001  whatever the file raises
        raise ConfigError(f"{path} raised {type(e).__name__}: {e}") from None
    if not isinstance(cd, ConfigDict):
        raise ConfigError(f"{path}: get_config() returned a {type(cd).__name__}, not a ConfigDict")
    return cd


# ----------------------------------------------------------------------------- command lines


def config_path(value: str, configs_dir: str) -> str:
    """A config file: a path, or a file of `configs_dir` by name (".py" optional); a
    ":variant" suffix is kept for `load_file`."""
    import os
    value, variant = split_variant(value)
    for path in (value, os.path.join(configs_dir, value), os.path.join(configs_dir, value + ".py")):
        if os.path.isfile(path):
            return path if variant is None else f"{path}:{variant}"
    names = sorted(f for f in os.listdir(configs_dir) if f.endswith(".py")) if os.path.isdir(configs_dir) else []
    raise ConfigError(f"no config {value!r} (not a file, not in configs/: {', '.join(names)})")


def config_name(argv: Sequence[str]) -> str | None:
    """The value of --config in `argv`, as `from_command_line` reads it (which takes it out of
    the arguments it returns): launchers that record which config a run came from."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg[len("--config="):]
    return None


def from_command_line(argv: Sequence[str], configs_dir: str) -> tuple[RunConfig | None, list[str], bool]:
    """(the checked config of `--config NAME` and its `--config.a.b=v` overrides, or None when
    no --config is given; the other arguments, for the caller; whether --help / -h was given)."""
    name, overrides, rest, show_help = None, [], [], False
    args = iter(argv)
    for arg in args:
        if arg in ("--help", "-h"):
            show_help = True
        elif arg == "--config":
            name = next(args, None)
        elif arg.startswith("--config="):
            name = arg[len("--config="):]
        elif arg.startswith("--config."):
            item = arg[len("--config."):]
            if "=" not in item:  # `--config.steps 10`
                item += "=" + (next(args, None) or "")
            overrides.append(item)
        else:
            rest.append(arg)
    if not name:
        if overrides:
            raise ConfigError("--config.FIELD overrides need --config NAME_OR_PATH first")
        return None, rest, show_help
    cd = load_file(config_path(name, configs_dir))
    return from_configdict(parse_overrides(cd, overrides)), rest, show_help


# The files that declare the fields, and the prefix of their sections there (the comment on
# each field's line documents it; the other config files only override values).
FIELD_FILES = {"base.py": ("c.", ""), "rwml.py": ("w.", "rwml.")}


def field_comments(configs_dir: str) -> dict[str, str]:
    """{"rl.lr": "AdamW learning rate ...", ...} from the declaring config files' comments."""
    import os
    import re
    out = {}
    for name, (prefix, section) in FIELD_FILES.items():
        path = os.path.join(configs_dir, name)
        if not os.path.isfile(path):
            continue
        pattern = re.compile(rf"^\s*{re.escape(prefix)}([\w.]+)\s*=.*?#\s*(.+)$")
        for line in open(path):
            m = pattern.match(line)
            if m:
                out[section + m.group(1)] = m.group(2).strip()
    return out


def describe(cfg: RunConfig, configs_dir: str) -> str:
    """Every field of `cfg`, a line each: `--config.name=value  # its comment`."""
    comments = field_comments(configs_dir)
    lines = []

    def walk(d: dict, where: str) -> None:
        for key, value in d.items():
            if isinstance(value, dict):
                walk(value, f"{where}{key}.")
            else:
                comment = comments.get(where + key)
                lines.append(f"  --config.{where}{key}={value!r}" + (f"  # {comment}" if comment else ""))
    walk(cfg.to_dict(), "")
    return "\n".join(lines)
