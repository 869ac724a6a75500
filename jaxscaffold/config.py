"""The run configuration: every field declared once, here, and checked before anything is built.

Each field is one line of a frozen dataclass: its type, default, allowed values (`choices`, or
a range: `ge` / `gt` / `le`) and a one-line description, through `field(...)`. From the
declarations come the ConfigDict every config file starts from (`defaults()`, which
`configs/base.py` returns), the command line's `--help` (`describe`) and the checks.

Config files (`configs/*.py`) stay ml_collections ConfigDicts that override values;
`from_configdict` turns one into a `RunConfig` and checks it: unknown fields (with a "did you
mean"), missing fields, types, allowed values, ranges and the fields that depend on each
other. Names that other modules define (algorithm presets, model presets, environments,
feedback forms, vocabularies) are checked by those modules at start-up
(`jaxscaffold.train.config_checks`): this module imports nothing from the package. A problem
is a `ConfigError`, a one-line message naming the field and what it allows.

The command line (`from_command_line`, `parse_overrides`) goes through ml_collections' own
config flags (`--config NAME[:variant] --config.rl.lr=1e-6`), each value parsed as its
field's type, absl's errors reworded to the same one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from typing import Any, Mapping, Sequence

from ml_collections import ConfigDict

DTYPES = ("float32", "bfloat16", "float16")
HELP_FLAGS = ("--help", "-h", "--helpfull")


class ConfigError(ValueError):
    """A config field is unknown, missing, mistyped or out of its allowed values (one line)."""


def field(default: Any, help: str, *, choices: Sequence | None = None, ge=None, gt=None, le=None) -> Any:
    """One config field: its default, a one-line description, and what it allows: one of
    `choices`, or a range (at least `ge`, or more than `gt`; at most `le`)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "ge": ge, "gt": gt, "le": le})


def section(cls: type, help: str, *, optional: bool = False, in_base: bool = True) -> Any:
    """A nested section of fields. A config without it gets its defaults, or None (the section
    is off) when `optional`; `in_base`: part of every config (`defaults()`), else added by the
    configs that use it (configs/rwml.py)."""
    meta = {"help": help, "section": cls, "in_base": in_base}
    if optional:
        return dataclasses.field(default=None, metadata=meta)
    return dataclasses.field(default_factory=cls, metadata=meta)


# ----------------------------------------------------------------------------- declarations


@dataclasses.dataclass(frozen=True)
class Model:
    hf_path: str = field("", "HF checkpoint: a local directory or a hub id (Qwen/Qwen3-4B: from the hub cache, downloaded there unless HF_HUB_OFFLINE); empty: random init of `preset`")
    preset: str = field("qwen3-4b", "jaxscaffold.models.config preset name, or \"tiny\"")
    tokenizer: str = field("", "HF tokenizer: a directory or a hub id; empty: hf_path's, else the offline Qwen3 one")
    vocabulary: str = field("", "word-level testbed vocabulary (rooms): its WordTokenizer, and a preset's embedding resized to it; empty: the tokenizer above")
    param_dtype: str = field("float32", "master weights", choices=DTYPES)
    compute_dtype: str = field("bfloat16", "matmuls (accumulated in f32)", choices=DTYPES)
    cache_dtype: str = field("bfloat16", "sampler KV cache", choices=DTYPES)
    scan_layers: bool = field(True, "lax.scan over layers (compile time flat in depth)")
    remat_policy: str = field("full", "activation memory vs recompute", choices=("none", "full", "save_dots"))


@dataclasses.dataclass(frozen=True)
class Mesh:
    data: int = field(-1, "pure data parallelism (-1: all remaining devices)")
    fsdp: int = field(1, "data parallel with sharded parameters and optimizer state (-1: all remaining devices)")
    tensor: int = field(1, "tensor parallelism over heads / MLP / vocab (-1: all remaining devices)")
    devices: int = field(0, "the first n devices only (0: all); one process only, e.g. to leave some free", ge=0)
    rollout_devices: int = field(0, "split the pod: the last n of the devices above sample (rollouts, evaluation), the others train; on P processes the last n/P of each; weights copied device to device after each update; pair with rollout.max_staleness >= 1 (0: every device does both, in turn)", ge=0)


@dataclasses.dataclass(frozen=True)
class RL:
    algorithm: str = field("grpo", "grpo | dapo | gspo | drgrpo (jaxscaffold.rl.presets)")
    lr: float = field(1e-6, "AdamW learning rate (after warmup: rl.lr_schedule)", gt=0.0)
    weight_decay: float = field(0.01, "AdamW decoupled weight decay", ge=0.0)
    grad_clip: float = field(1.0, "global-norm gradient clipping", ge=0.0)
    warmup_steps: int = field(0, "linear warmup of the learning rate", ge=0)
    lr_schedule: str = field("constant", "the learning rate after warmup: constant, or cosine (to 0 at the run's last step)", choices=("constant", "cosine"))
    ppo_epochs: int = field(1, "passes over each rollout batch", ge=1)
    num_minibatches: int = field(1, "optimizer steps per epoch (1: the whole batch; rl.minibatch_rows sets them by rows, as the reference)", ge=1)
    micro_batches: int = field(1, "gradient-accumulation micro-batches per optimizer step", ge=1)
    kl_coef: float = field(0.0, "KL-to-reference loss weight (0: off, as the reference)", ge=0.0)
    entropy_coef: float = field(0.0, "entropy bonus weight", ge=0.0)
    minibatch_rows: int = field(0, "rows per optimizer step: ceil(rows / this) near-equal mini-batches (the reference: 128 step rows); 0: rl.num_minibatches", ge=0)
    recompute_old_logprobs: bool = field(False, "True: the trainer recomputes the old log-probs before the updates (the reference, verl); False: the sampler's")
    tis_cap: float = field(0.0, "truncated importance sampling: token loss x min(pi_trainer_old / pi_sampler, cap), e.g. 2 (Yao et al.); 0: off (needs recompute_old_logprobs)", ge=0.0)
    mis: str = field("off", "masked importance sampling: mask tokens (or whole rows, geometric-mean ratio) whose ratio pi / pi_sampler leaves [mis_lo, mis_hi]", choices=("off", "token", "sequence"))
    mis_lo: float = field(0.5, "MIS: the lowest ratio kept", ge=0.0)
    mis_hi: float = field(2.0, "MIS: the highest ratio kept")
    mis_denominator: str = field("all", "MIS: all (a masked token still counts in the aggregation's denominators: the step shrinks with what is masked) | kept (verl: masked tokens leave the counts; needs rl.recompute_old_logprobs)", choices=("all", "kept"))
    dynamic_sampling_exhausted: str = field("continue", "DAPO after max_num_gen_batches: continue (train on the groups collected, as the reference) | raise", choices=("continue", "raise"))
    overlong_buffer: int = field(0, "DAPO's overlong length penalty over the last this-many tokens of a turn's budget (DAPO paper: e.g. 512); 0: off, as the reference's DAPO", ge=0)
    group_stats: str = field("trajectory", "step-wise rows: a group's mean/std counts each trajectory once (\"trajectory\") or every step row (\"row\": verl-agent, the reference)", choices=("trajectory", "row"))
    max_bad_steps: int = field(3, "consecutive steps whose update was skipped (non-finite loss or gradient) before the run stops (exit 1)", ge=1)
    max_empty_steps: int = field(3, "consecutive steps where every episode failed or no row reached the loss before the run stops (exit 1)", ge=1)


@dataclasses.dataclass(frozen=True)
class Rollout:
    tasks_per_step: int = field(16, "distinct tasks (GRPO groups) per training step", ge=1)
    group_size: int = field(8, "rollouts per task", ge=1)
    max_turns: int = field(15, "environment steps per episode in training", ge=1)
    max_new_tokens: int = field(512, "tokens per model turn", ge=1)
    max_len: int = field(8192, "context (KV-cache slots) per episode")
    temperature: float = field(1.0, "sampling temperature in training", ge=0.0)
    top_p: float = field(1.0, "nucleus sampling in training", gt=0.0, le=1.0)
    enable_thinking: bool = field(True, "Qwen3 thinking mode in the generation prompt")
    representation: str = field("trajectory", "trajectory (one token sequence per episode) | stepwise (the reference code's rows)", choices=("trajectory", "stepwise"))
    history_window: int = field(2, "stepwise: (observation, action) steps shown in each rebuilt prompt", ge=0)
    sampler_devices: int = field(0, "devices a host samples on, tensor parallel (0: all of its devices of the training mesh; 1: one device, unsharded on one process)", ge=0)
    max_staleness: int = field(0, "k > 0: a background collector samples up to k steps ahead of training (step t with the policy after step t - 1 - k); rows more than k versions old are dropped (0: on-policy, collect then train)", ge=0)
    partial: bool = field(False, "with max_staleness >= 1: episodes running when the trainer publishes a newer policy continue under it from the next decode chunk (each token keeps the version that sampled it; the KV cache of earlier tokens is kept); False: an episode is sampled by one version")
    max_rows_in_flight: int = field(0, "sampler rows at once: the step's groups in waves of whole groups (0: all at once; a memory knob, the KV cache scales with it)", ge=0)
    kv_cache: str = field("contiguous", "the TPU / GPU sampler's KV cache: contiguous (max_len slots a row) | paged (a pool of pages, taken as rows grow; docs/design/kernels.md)", choices=("contiguous", "paged"))
    page_size: int = field(64, "paged: tokens a page", ge=1)
    kv_pages: int = field(0, "paged: pages in the pool (0: every row at max_len; fewer: more rows in the same memory, launch/plan.py's rows_that_fit; a row finding none ends truncated)", ge=0)
    lockstep: bool = field(False, "True: all episodes step together turn by turn (the reference); False: each episode advances on its own")
    decode_chunk: int = field(16, "asynchronous rollouts: tokens each ready row decodes before observations and new episodes join", ge=1)
    admit_wait_ms: float = field(500.0, "asynchronous rollouts: while rows decode, how long an episode whose env has reset waits for the other resets in flight to be prefilled with it (0: at once)", ge=0.0)


@dataclasses.dataclass(frozen=True)
class Tau2User:
    """tau2's user simulator (`train.user_model`). Mode "model": our sampler serves the model in
    the trainer's process, on its devices, behind a loopback chat endpoint that pool workers and
    in-process envs alike call (one per process)."""

    mode: str = field("model", "model (served by our sampler: hf_path or preset) | endpoint (url, e.g. launch/serve_chat.py) | none (no user: explicit)", choices=("model", "endpoint", "none"))
    hf_path: str = field("", "mode model: an HF chat model (with its tokenizer), a local directory or a hub id")
    preset: str = field("", "mode model: instead, random weights of a preset (\"tiny\": tests) with the offline Qwen3 tokenizer")
    url: str = field("", "mode endpoint: an OpenAI-compatible base URL, e.g. http://127.0.0.1:8011/v1")
    temperature: float = field(0.0, "the user's sampling temperature (tau2's default: 0.0; 0 is greedy)", ge=0.0)
    top_p: float = field(1.0, "the user's nucleus sampling", gt=0.0, le=1.0)
    max_tokens: int = field(1024, "tokens per user reply", ge=1)
    max_len: int = field(8192, "mode model: prompt + reply tokens of one user request, at most")
    slots: int = field(8, "mode model: user requests generated together, at most", ge=1)
    compute_dtype: str = field("bfloat16", "mode model: the user model's compute dtype", choices=DTYPES)
    enable_thinking: bool = field(False, "mode model: let the user model reason before replying (reasoning is dropped)")
    timeout_s: float = field(120.0, "seconds an env waits for one user reply (a pool worker is also cut at envs.step_timeout_s: raise it for slow user models)", gt=0.0)
    seed: int = field(0, "mode model with a preset: the random weights' seed")


@dataclasses.dataclass(frozen=True)
class Envs:
    train: str = field("sciworld,bfcl", "comma-separated env names (jaxscaffold.envs.registry), env:split allowed")
    train_split: str = field("train", "catalogue split to train on")
    eval: str = field("sciworld::128,bfcl:validation", "evaluated envs (standard env, greedy); env:split:n overrides; as the reference: 128 ScienceWorld, all 400 BFCL validation entries")
    eval_split: str = field("test", "held-out split")
    num_workers: int = field(4, "environment worker processes (0: in this process)", ge=0)
    step_timeout_s: float = field(60.0, "a worker silent this long is restarted; its episodes fail", gt=0.0)
    reset_timeout_s: float = field(180.0, "the same for resets (the first ones start JVMs)", gt=0.0)
    env_kwargs: str = field("", "JSON {env: {constructor kwarg: value}}, e.g. '{\"tau2\": {\"max_steps\": 30}}' (tau2's user: envs.tau2_user)")
    tau2_user: Tau2User = section(Tau2User, "tau2's user simulator: a run with tau2 needs one, or mode \"none\"")

    def kwargs(self) -> dict[str, dict]:
        """`env_kwargs` parsed: {env name: constructor kwargs} (validated at load)."""
        return json.loads(self.env_kwargs) if self.env_kwargs else {}


@dataclasses.dataclass(frozen=True)
class Feedback:
    schedule: str = field("ag_early_oe_late", "jaxscaffold.feedback.schedule.make name; \"none\" = standard; \"bandit\" = learned (bandit_* below)")
    probability: float = field(0.5, "chance a group gets the active feedback", ge=0.0, le=1.0)
    mode: str = field("group", "randomisation of who gets feedback", choices=("group", "rollout", "first_half", "even"))
    switch_step: int = field(100, "training step where AG hands over to OE", ge=0)
    ag_form: str = field("paper", "paper (next gold action) | reference (first 3 gold + [Caution!])")
    oe_form: str = field("checklist", "checklist ([Pass]/[Pending], [k/n done]) | reference (raw progress)")
    bandit_arms: str = field("none,ag_early,ag_late,oe_early,oe_late", "schedules a \"bandit\" schedule picks one of per training step")
    bandit_signal: str = field("informative", "arm reward: informative (share of groups with unequal rewards) | success (mean success)", choices=("informative", "success"))
    bandit_discount: float = field(0.95, "per-step decay of the arms' Beta posteriors to the prior (follows a drifting best arm)", ge=0.0, le=1.0)
    bandit_prior: float = field(1.0, "every arm starts at Beta(prior, prior)", gt=0.0)

    def arms(self) -> list[str]:
        """The schedule names a "bandit" schedule picks from."""
        return [a.strip() for a in self.bandit_arms.split(",") if a.strip()]


@dataclasses.dataclass(frozen=True)
class Eval:
    every: int = field(5, "evaluate every N training steps (0: never)", ge=0)
    tasks: int = field(0, "held-out tasks per evaluated env at most (its envs.eval n, else its whole split; 0: no cap), balanced over its categories, group 1", ge=0)
    max_turns: int = field(30, "environment steps per evaluation episode", ge=1)
    max_len: int = field(0, "context (KV-cache slots) per evaluation episode (0: rollout.max_len)", ge=0)
    at_start: bool = field(True, "also evaluate before the first training step (step 0 of a fresh run), as the reference; needs eval.every > 0")
    batch_size: int = field(0, "evaluation sampler rows per process (0: the smaller of eval.tasks and the training rollout rows; those rows when eval.tasks is 0)", ge=0)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    every: int = field(10, "save every N steps (and at the end)", ge=1)
    keep: int = field(3, "checkpoints kept", ge=1)
    allow_change: str = field("", "comma-separated fields a resume may change (e.g. \"rl.lr\"); other changes are refused")
    params_only_every: int = field(0, "also save the parameters alone (no optimizer state: 1/3 the size) every N steps to out_dir/params (0: never); a resume cannot start from one", ge=0)
    params_only_keep: int = field(0, "params-only checkpoints kept (0: all)", ge=0)

    def allowed_changes(self) -> list[str]:
        """The dotted fields `allow_change` lists."""
        return [a.strip() for a in self.allow_change.split(",") if a.strip()]


@dataclasses.dataclass(frozen=True)
class Export:
    """The HF export at the end of a run (`train.export.export_checkpoint`)."""

    at_end: bool = field(False, "after the last step, write the final parameters (LoRA: merged) as an HF directory, as launch/export_hf.py does")
    dir: str = field("", "that directory (empty: out_dir/hf)")
    dtype: str = field("", "its tensors' dtype (empty: model.param_dtype)", choices=("", *DTYPES))
    verify: bool = field(False, "also reload it with transformers and compare logits (holds the model twice in host memory: off at scale)")


@dataclasses.dataclass(frozen=True)
class Logging:
    verbose: bool = field(False, "also third-party INFO logs (Orbax, absl, JAX); off: their warnings and errors only")
    wandb: str = field("off", "off | offline (files in out_dir/wandb, `wandb sync` uploads them) | online (needs wandb)", choices=("off", "offline", "online"))
    wandb_project: str = field("jaxscaffold", "wandb project of the run (the run is named after out_dir)")


@dataclasses.dataclass(frozen=True)
class Memory:
    check_at_start: bool = field(True, "compile the memory plan (launch/plan.py's) at start; refuse a run that cannot fit")
    hbm_gb: float = field(0.0, "memory per device to check against, GB; 0: the device's own limit (none on CPU: no check)", ge=0.0)


@dataclasses.dataclass(frozen=True)
class Lora:
    rank: int = field(0, "LoRA adapter rank (0: off, full fine-tuning); on: only the adapters train and are checkpointed", ge=0)
    alpha: float = field(16.0, "LoRA scale numerator: W' = W + alpha / rank * A @ B (as PEFT, not rsLoRA)", gt=0.0)
    targets: str = field("q,k,v,o,gate,up,down", "adapted projections, comma-separated among q,k,v,o,gate,up,down")
    base_dtype: str = field("bfloat16", "the frozen base weights' dtype (the adapters and their moments: model.param_dtype)", choices=DTYPES)

    def target_names(self) -> tuple[str, ...]:
        """`targets` parsed: the adapted matrices' names."""
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())


@dataclasses.dataclass(frozen=True)
class Filter:
    enabled: bool = field(True, "the difficulty filter (off: the \"w/o subsample\" ablation)")
    sft_share: float = field(0.1, "share of the training triples the light predictor is fine-tuned on", gt=0.0, le=1.0)
    sft_steps: int = field(50, "its SFT steps", ge=1)
    sft_batch: int = field(32, "its triples per SFT step", ge=1)
    sft_lr: float = field(1e-5, "its learning rate", gt=0.0)
    samples: int = field(10, "K predictions per remaining triple", ge=1)
    tau_d: float = field(0.07, "the filter's (stricter) threshold (paper: 0.1 with Qwen3-Embedding-8B)", gt=0.0, le=2.0)
    tau_easy: float = field(0.8, "mean reward >= this: easy (the paper gives no value: \"almost all K\")", ge=0.0, le=1.0)
    p_keep_easy: float = field(0.1, "chance an easy triple stays (the paper: 0.1)", ge=0.0, le=1.0)


@dataclasses.dataclass(frozen=True)
class RWML:
    objective: str = field("rl", "rl (RWML) | sft (the WM-SFT baseline: cross-entropy on the next state)", choices=("rl", "sft"))
    collect_policy: str = field("model", "model (rollouts of the initial policy, the paper) | explore (scripted: expert or random admissible step)", choices=("model", "explore"))
    collect_tasks: int = field(500, "env tasks rolled out to gather triples", ge=1)
    rollouts_per_task: int = field(3, "trajectories per task (the paper: ALFWorld 3, tau2 6)", ge=1)
    collect_max_turns: int = field(15, "env steps per collected trajectory", ge=1)
    collect_temperature: float = field(1.0, "sampling temperature of the collecting policy (the paper: 1.0)", ge=0.0)
    explore_gold_prob: float = field(0.5, "explorer: chance of the expert's next action instead of a random admissible one", ge=0.0, le=1.0)
    heldout_share: float = field(0.1, "share of the tasks whose triples are held out for world-model accuracy", gt=0.0, le=1.0)
    history_window: int = field(5, "(observation, action) steps shown before the current one (the first observation always)", ge=0)
    max_obs_chars: int = field(2000, "characters per observation in the prompt", ge=1)
    reward: str = field("embedding_facts", "embedding (the paper's: distance only) | embedding_facts (and the facts match) | lines (templated states, e.g. rooms: the share of differing lines) | judge_binary | judge_continuous (LLM-judge ablations)", choices=("embedding", "embedding_facts", "lines", "judge_binary", "judge_continuous"))
    embedder: str = field("minilm", "minilm (offline all-MiniLM-L6-v2) | qwen3 (Qwen3-Embedding on our port)", choices=("minilm", "qwen3"))
    embedder_path: str = field("", "qwen3: a local Qwen3-Embedding HF dir; minilm: empty for the bundled model")
    embedder_batch: int = field(64, "texts per embedding batch", ge=1)
    judge_path: str = field("", "judge_*: a local HF chat model directory")
    tau_d: float = field(0.14, "RL reward: 1 if 1 - cos < tau_d (paper, Qwen3-Embedding-8B: 0.2; calibrated for minilm)", gt=0.0, le=2.0)
    export_dir: str = field("", "HF export for stage 2 (empty: out_dir/hf)")
    epochs: float = field(2.0, "passes over the filtered training triples (the paper: 2); sets the steps (0: `steps` as given)", ge=0.0)
    filter: Filter = section(Filter, "the difficulty filter: a light predictor's K samples per triple drop the easy ones")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One run: what `launch/tpu_train.py` and `jaxscaffold.train` execute."""

    job: str = field("rl", "rl (task RL on environments: FEE, the baseline, RWML's stage 2) | rwml (world-model RL, configs/rwml.py) | sft (gold demonstrations, configs/sft.py)", choices=("rl", "rwml", "sft"))
    seed: int = field(0, "run seed: task order, sampling keys, feedback decisions (restart-safe)")
    out_dir: str = field("runs/default", "logs (tensorboard, metrics.jsonl), checkpoints, curves.png")
    steps: int = field(200, "training steps (one rollout batch + its optimizer steps each)", ge=1)
    model: Model = section(Model, "the policy model")
    mesh: Mesh = section(Mesh, "how the devices are split (at most one axis -1: fill)")
    rl: RL = section(RL, "the optimizer and the policy-gradient algorithm")
    rollout: Rollout = section(Rollout, "how training episodes are sampled")
    envs: Envs = section(Envs, "the environments trained and evaluated on")
    feedback: Feedback = section(Feedback, "FEE's feedback schedule")
    eval: Eval = section(Eval, "the held-out evaluation")
    checkpoint: Checkpoint = section(Checkpoint, "checkpoints (export and eval read either kind)")
    logging: Logging = section(Logging, "console and wandb logging")
    memory: Memory = section(Memory, "the start-up memory check")
    export: Export = section(Export, "the HF export at the end of a run")
    rwml: RWML | None = section(RWML, "world-model RL (configs/rwml.py); only job = \"rwml\" reads it", optional=True, in_base=False)
    lora: Lora | None = section(Lora, "LoRA adapters (a config without the section: off)", optional=True)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable values (checkpoints keep the config they were written with)."""
        return dataclasses.asdict(self)


def defaults(cls: type = RunConfig) -> ConfigDict:
    """The declared defaults of `cls` as a ConfigDict: what every config file starts from
    (`configs/base.py`); the sections not `in_base` (rwml) are added by the configs that use them."""
    cd = ConfigDict()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = f.metadata.get("section")
        if sub is not None:
            if f.metadata["in_base"]:
                cd[f.name] = defaults(sub)
        else:  # a float field's default as a float: ConfigDict types its overrides by the value
            cd[f.name] = float(f.default) if hints[f.name] is float else f.default
    return cd


def saved(d: Mapping, cls: type = RunConfig) -> ConfigDict:
    """A config a run saved (a checkpoint's, `RunConfig.to_dict`'s form) as a ConfigDict over
    the declared defaults: a field declared since the run was saved takes its default, so an
    older checkpoint still evaluates and exports; its other fields are checked as any config's."""
    base = {f.name: f for f in dataclasses.fields(cls)}
    out = defaults(cls)
    for key, value in dict(d).items():
        sub = base[key].metadata.get("section") if key in base else None
        if sub is not None and isinstance(value, Mapping):
            out[key] = saved(value, sub)
        else:
            out[key] = value
    return out


def declarations(cls: type = RunConfig, prefix: str = "") -> dict[str, tuple[type, dataclasses.Field]]:
    """Every leaf field by dotted name: {"rl.lr": (float, its Field), ...} (sections walked)."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if "section" in f.metadata:
            out.update(declarations(f.metadata["section"], f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = (hints[f.name], f)
    return out


# ----------------------------------------------------------------------------- building


def from_configdict(cd: ConfigDict | Mapping) -> RunConfig:
    """The typed run config of an ml_collections config (or its plain dict form), checked
    against the declarations (the names other modules define: `train.config_checks.check`)."""
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
        section_dict = d
        for name in parents:
            section_dict = section_dict[name]
        if leaf not in section_dict:
            raise ConfigError(f"unknown config field {path}")
        section_dict[leaf] = value
    return from_dict(d)


def from_dict(d: Mapping) -> RunConfig:
    """`RunConfig.to_dict`'s inverse, checked: every field must be there (a checkpoint's
    config, written before fields were declared since, reads through `saved`)."""
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
        sub = f.metadata.get("section")
        if name not in d:
            if sub is not None:  # a config written before the section: its defaults (or off)
                continue
            raise ConfigError(f"config.{path}{name} is missing (configs start from configs/base.py's get_config())")
        if sub is not None:
            values[name] = None if d[name] is None and f.default is None else _build(sub, d[name], f"{path}{name}.")
        else:
            values[name] = _typed(hints[name], f, d[name], f"{path}{name}")
    return cls(**values)


def _typed(hint: type, f: dataclasses.Field, value, path: str):
    """`value` as the field's type within its choices, or a ConfigError naming the field."""
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
    if f.metadata.get("choices") is not None:
        one_of(path, value, f.metadata["choices"])
    return value


def _did_you_mean(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else f" (fields: {', '.join(known)})"


# ----------------------------------------------------------------------------- checks


def validate(cfg: RunConfig) -> None:
    """The declared ranges, and the fields that depend on each other. Raises ConfigError.
    (Names other modules define: `jaxscaffold.train.config_checks`.)"""
    _check_declared(cfg, "")
    if not cfg.out_dir.strip():
        raise ConfigError("config.out_dir is empty: name the run's directory (e.g. runs/my_run)")
    for axis in ("data", "fsdp", "tensor"):
        if getattr(cfg.mesh, axis) == 0 or getattr(cfg.mesh, axis) < -1:
            raise ConfigError(f"config.mesh.{axis}={getattr(cfg.mesh, axis)} must be >= 1 (or -1: fill)")
    if [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor].count(-1) > 1:
        raise ConfigError("config.mesh: at most one of data / fsdp / tensor may be -1 (fill)")
    f = cfg.feedback
    if f.schedule == "bandit" and not f.arms():
        raise ConfigError("config.feedback.bandit_arms names no schedule (comma-separated schedule names)")
    _check_env_kwargs(cfg.envs.env_kwargs)
    _check_update(cfg.rl)
    c = cfg.rollout
    if c.kv_pages and c.kv_pages < 2:
        raise ConfigError(f"config.rollout.kv_pages={c.kv_pages} must be 0 (every row at max_len) or at least 2 "
                          "(page 0 is scratch)")
    if c.partial and (c.max_staleness < 1 or c.lockstep):
        raise ConfigError(f"config.rollout.partial needs rollout.max_staleness >= 1 (got {c.max_staleness}) and "
                          f"the asynchronous driver (rollout.lockstep=False): weights change between decode chunks")
    if 0 < c.max_rows_in_flight < c.group_size:
        raise ConfigError(f"config.rollout.max_rows_in_flight={c.max_rows_in_flight} must be 0 (all rows at once) "
                          f"or at least rollout.group_size={c.group_size} (a wave holds whole groups)")
    if c.max_len <= c.max_new_tokens:
        raise ConfigError(f"config.rollout.max_len={c.max_len} must exceed rollout.max_new_tokens={c.max_new_tokens}")
    if cfg.eval.max_len and cfg.eval.max_len <= c.max_new_tokens:
        raise ConfigError(f"config.eval.max_len={cfg.eval.max_len} must be 0 (rollout.max_len) or exceed "
                          f"rollout.max_new_tokens={c.max_new_tokens}")
    if cfg.model.vocabulary and cfg.model.tokenizer:  # a word-level vocabulary is a tokenizer of its own
        raise ConfigError(f"config.model.vocabulary={cfg.model.vocabulary!r} and config.model.tokenizer="
                          f"{cfg.model.tokenizer!r}: set one of them")
    _check_run_ux(cfg)
    if cfg.job == "rwml":
        _check_rwml(cfg)
    if cfg.lora is not None and cfg.lora.rank and cfg.job != "rl":
        raise ConfigError(f"config.lora.rank={cfg.lora.rank}: LoRA trains task RL (job='rl') only, not job={cfg.job!r}")
    _check_tau2_user(cfg.envs.tau2_user)


def _check_declared(obj, where: str) -> None:
    """Every field of `obj` (and its sections) within its declared range."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if "section" in f.metadata:
            if value is not None:
                _check_declared(value, f"{where}{f.name}.")
            continue
        ge, gt, le = (f.metadata.get(bound) for bound in ("ge", "gt", "le"))
        if ge is not None or gt is not None:
            check_range(where + f.name, value, gt if ge is None else ge, le, strict=ge is None)


def _check_update(r: RL) -> None:
    """The mini-batching, old log-prob, TIS and MIS fields (one way to say each thing)."""
    if r.minibatch_rows and r.num_minibatches != 1:
        raise ConfigError(f"config.rl.minibatch_rows={r.minibatch_rows} sets the mini-batches by rows: leave "
                          f"rl.num_minibatches at 1 (got {r.num_minibatches})")
    if r.tis_cap and not r.recompute_old_logprobs:
        raise ConfigError(f"config.rl.tis_cap={r.tis_cap} weights by pi_trainer_old / pi_sampler: it needs "
                          "rl.recompute_old_logprobs=True")
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
    embedding = w.reward in ("embedding", "embedding_facts")
    if w.embedder == "qwen3" and embedding and not w.embedder_path:
        raise ConfigError("config.rwml.embedder='qwen3' needs rwml.embedder_path (a local Qwen3-Embedding HF dir)")
    if w.reward.startswith("judge_") and not w.judge_path:
        raise ConfigError(f"config.rwml.reward={w.reward!r} needs rwml.judge_path (a local HF chat model dir)")


def one_of(path: str, value, allowed: Sequence) -> None:
    """ConfigError unless `value` is in `allowed` (the message lists them)."""
    if value not in allowed:
        raise ConfigError(f"config.{path}={value!r} is not one of: {', '.join(map(str, allowed))}")


def check_range(path: str, value, low, high=None, *, strict: bool = False) -> None:
    """ConfigError unless `low <= value <= high` (`low < value` when strict); `high` None: no
    upper bound. NaN is out of every range (it compares false with everything)."""
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


def _check_tau2_user(u: Tau2User) -> None:
    """The user simulator is named in one way (whether a run needs one: config_checks)."""
    if u.max_len <= u.max_tokens:
        raise ConfigError(f"config.envs.tau2_user.max_len={u.max_len} must exceed envs.tau2_user.max_tokens={u.max_tokens}")
    given = [f"{n}={getattr(u, n)!r}" for n in ("hf_path", "preset", "url") if getattr(u, n)]
    if u.mode == "model" and (bool(u.hf_path) == bool(u.preset) or u.url) and given:
        raise ConfigError(f"config.envs.tau2_user.mode='model' serves one model: hf_path or preset, not {' and '.join(given)}")
    if u.mode == "endpoint" and (not u.url.startswith(("http://", "https://")) or u.hf_path or u.preset):
        raise ConfigError(f"config.envs.tau2_user.mode='endpoint' needs url (an OpenAI-compatible base URL, e.g. "
                          f"http://127.0.0.1:8011/v1) and no model: got {', '.join(given) or 'none'}")
    if u.mode == "none" and given:
        raise ConfigError(f"config.envs.tau2_user.mode='none' runs without a user: clear {', '.join(given)}")


def _check_env_kwargs(text: str) -> None:
    """JSON mapping env names to objects of kwargs (the names: config_checks)."""
    if not text:
        return
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"config.envs.env_kwargs is not JSON ({e}): {text!r}") from None
    if not isinstance(kwargs, dict) or not all(isinstance(v, dict) for v in kwargs.values()):
        raise ConfigError(f"config.envs.env_kwargs must map env names to objects of kwargs: {text!r}")
    if "user" in kwargs.get("tau2", {}):
        raise ConfigError("config.envs.env_kwargs sets tau2's user: configure it in envs.tau2_user instead "
                          "(mode='endpoint' with url, or mode='model' with hf_path / preset)")


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


def parse_overrides(cd: ConfigDict, overrides: Sequence[str]) -> ConfigDict:
    """Applies `path=value` overrides (the `--config.` prefix stripped) to `cd` in place,
    through ml_collections' config flags: each value parsed as its field's type; unknown
    paths get a "did you mean"."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} has no value: write --config.{item}=VALUE")
    _apply_flags(cd, [f"--config.{item}" for item in overrides])
    return cd


def _apply_flags(cd: ConfigDict, overrides: Sequence[str]) -> None:
    """Parses `--config.a.b=v` overrides with an absl flag of `cd` (ml_collections'
    `DEFINE_config_dict`), which sets `cd`'s fields in place, each value parsed as its type.
    absl's errors come back as one-line ConfigErrors in this module's words."""
    from absl import flags
    from ml_collections import config_flags

    for arg in overrides:
        _check_override_path(cd, _override_path(arg))
    argv = ["prog", *overrides]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_dict("config", cd, "the run config", flag_values=flag_values, sys_argv=argv)
    try:
        flag_values(argv)
    except flags.Error as e:
        raise ConfigError(_reworded(str(e), overrides)) from None


def _override_path(arg: str) -> str:
    return arg[len("--config."):].partition("=")[0]


def _check_override_path(cd: ConfigDict, path: str) -> None:
    """A declared field that `cd` holds, or the old one-line errors ("did you mean")."""
    *parents, leaf = path.split(".")
    cls, where, section_cd = RunConfig, "", cd
    for name in parents:
        sub = _declared(cls, name, where)
        if "section" not in sub.metadata or section_cd.get(name) is None:
            raise ConfigError(f"config.{where}{name} is not a section")
        cls, where, section_cd = sub.metadata["section"], f"{where}{name}.", section_cd[name]
    if "section" in _declared(cls, leaf, where).metadata:
        raise ConfigError(f"config.{where}{leaf} is a section: override its fields (--config.{where}{leaf}.FIELD=...)")


def _declared(cls: type, name: str, where: str) -> dataclasses.Field:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise ConfigError(f"unknown config field {where}{name}{_did_you_mean(name, list(fields))}")
    return fields[name]


def _reworded(message: str, args: Sequence[str]) -> str:
    """absl's "flag --config.steps=ten: invalid literal..." as "config.steps='ten' must be a int"."""
    fields = declarations()
    for arg in args:
        path = _override_path(arg) if arg.startswith("--config.") else None
        if path in fields and f"--config.{path}" in message:
            hint = fields[path][0]
            text = arg.partition("=")[2]
            suffix = " (true or false)" if hint is bool else ""
            return f"config.{path}={text!r} must be a {hint.__name__}{suffix}"
    return message.splitlines()[0] if message else "bad command line"


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
    """(the checked config of `--config NAME[:variant]` and its `--config.a.b=v` overrides, or
    None when no --config is given; the other arguments, for the caller; whether --help / -h /
    --helpfull was given)."""
    name, overrides, rest, show_help = None, [], [], False
    fields = declarations()
    args = iter(argv)
    for arg in args:
        if arg in HELP_FLAGS:
            show_help = True
        elif arg == "--config":
            name = next(args, None)
        elif arg.startswith("--config="):
            name = arg[len("--config="):]
        elif arg.startswith("--config."):
            path = _override_path(arg)
            if "=" not in arg and path in fields and fields[path][0] is not bool:  # `--config.steps 10`
                arg += "=" + (next(args, None) or "")
            overrides.append(arg)
        else:
            rest.append(arg)
    if not name:
        if overrides:
            raise ConfigError("--config.FIELD overrides need --config NAME_OR_PATH first")
        return None, rest, show_help
    cd = load_file(config_path(name, configs_dir))
    _apply_flags(cd, overrides)
    return from_configdict(cd), rest, show_help


def describe(cfg: RunConfig) -> str:
    """Every field of `cfg`, a line each, from the declarations:
    `--config.name=value  # description [type, allowed values; default]`."""
    fields = declarations()
    sections = {f.name: f for f in dataclasses.fields(RunConfig) if "section" in f.metadata}
    lines = []
    for name, value in flat_fields(cfg.to_dict()).items():
        if name not in fields:  # an optional section that is off (None)
            lines.append(f"  --config.{name}={value!r}  # {sections[name].metadata['help']} [section, off]")
            continue
        hint, f = fields[name]
        allowed = f.metadata.get("choices")
        kind = hint.__name__ + (": " + " | ".join(map(repr, allowed)) if allowed else _bounds(f.metadata))
        lines.append(f"  --config.{name}={value!r}  # {f.metadata.get('help', '')} [{kind}; default {f.default!r}]")
    return "\n".join(lines)


def _bounds(meta: Mapping) -> str:
    ge, gt, le = (meta.get(bound) for bound in ("ge", "gt", "le"))
    low = f" >= {ge}" if ge is not None else f" > {gt}" if gt is not None else ""
    return low + (f", <= {le}" if le is not None else "")
