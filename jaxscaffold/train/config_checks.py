"""The config's names that other modules define, checked once at start-up.

`jaxscaffold.config` checks types, declared choices, ranges and the fields that depend on each
other, and imports nothing from the package; the names it cannot know (algorithm presets,
model presets, LoRA targets, feedback schedules and forms, environments and their splits, word
vocabularies) belong to their modules, and `check` asks each of them. The launchers call it
right after typing the config (`checked`), and `startup.preflight` again for library callers
of `train(cfg)`. Each problem is the same one-line `ConfigError` naming the field and what it
allows.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from jaxscaffold import config as config_lib
from jaxscaffold.config import ConfigError, RunConfig, one_of


def checked(cfg: RunConfig | ConfigDict) -> RunConfig:
    """`cfg` typed (`config.typed`) and its names checked: what a launcher runs."""
    cfg = config_lib.typed(cfg)
    check(cfg)
    return cfg


def check(cfg: RunConfig) -> None:
    """Every name of `cfg` that another module defines; raises ConfigError (one line)."""
    _check_model(cfg)
    _check_algorithm(cfg.rl.algorithm)
    _check_feedback(cfg.feedback)
    _check_envs(cfg)
    if cfg.lora is not None:
        _check_lora_targets(cfg.lora)


def _check_algorithm(name: str) -> None:
    from jaxscaffold.rl import presets
    one_of("rl.algorithm", name, sorted(presets.PRESETS))


def _check_model(cfg: RunConfig) -> None:
    from jaxscaffold.models import config as model_configs
    from jaxscaffold.train.vocabularies import VOCABULARIES

    if not cfg.model.hf_path:
        one_of("model.preset", cfg.model.preset.lower(), ["tiny", *model_configs.PRESETS])
        if cfg.model.preset.lower() == "tiny" and cfg.model.preset != "tiny":  # the build knows "tiny" alone
            raise ConfigError(f"config.model.preset={cfg.model.preset!r}: write 'tiny' (lower case)")
    one_of("model.vocabulary", cfg.model.vocabulary, ["", *VOCABULARIES])
    user = cfg.envs.tau2_user
    if user.preset:
        one_of("envs.tau2_user.preset", user.preset.lower(), ["tiny", *model_configs.PRESETS])


def _check_feedback(f: config_lib.Feedback) -> None:
    from jaxscaffold.feedback import enrichers, schedule

    if f.schedule == "bandit":
        for arm in f.arms():
            one_of("feedback.bandit_arms", arm, schedule.NAMES)
    else:
        one_of("feedback.schedule", f.schedule, [*schedule.NAMES, "bandit"])
    for kind, form in (("ag", f.ag_form), ("oe", f.oe_form)):
        one_of(f"feedback.{kind}_form", form, enrichers.form_names(kind))


def _check_envs(cfg: RunConfig) -> None:
    from jaxscaffold.envs import registry

    _check_tasks("envs.train", cfg.envs.train, cfg.envs.train_split)
    _check_tasks("envs.eval", cfg.envs.eval, cfg.envs.eval_split)
    for name in cfg.envs.kwargs():
        one_of("envs.env_kwargs (environment)", name, list(registry.ENVS))
    u = cfg.envs.tau2_user
    given = [n for n in ("hf_path", "preset", "url") if getattr(u, n)]
    for field in ("train", "eval"):
        spec = getattr(cfg.envs, field)
        if u.mode == "model" and not given and "tau2" in {s.env for s in registry.parse_task_spec(spec)}:
            raise ConfigError(f"config.envs.{field}={spec!r} runs tau2, whose user simulator needs a chat model: set "
                              "envs.tau2_user.hf_path (a local HF chat model dir) or .preset ('tiny': tests), or "
                              "mode='endpoint' with url; mode='none' runs without a user (telecom solo; retail / "
                              "airline messages unanswered)")


def _check_tasks(path: str, spec: str, default_split: str) -> None:
    from jaxscaffold.envs import registry

    try:
        entries = [(s.env, s.split or default_split, s.limit) for s in registry.parse_task_spec(spec)]
    except ValueError as e:
        raise ConfigError(f"config.{path}: {e}") from None
    if not entries:
        raise ConfigError(f"config.{path} names no environment (comma-separated names of: {', '.join(registry.ENVS)})")
    for name, split, limit in entries:
        one_of(f"{path} (environment)", name, list(registry.ENVS))
        try:
            registry.check_split(name, split)
        except ValueError as e:
            raise ConfigError(f"config.{path}: {e}") from None
        if limit is not None and limit < 1:
            raise ConfigError(f"config.{path}: {name}'s task count must be >= 1")


def _check_lora_targets(lo: config_lib.Lora) -> None:
    from jaxscaffold.models import lora

    if not lo.target_names():
        raise ConfigError(f"config.lora.targets={lo.targets!r} names no matrix (comma-separated among "
                          f"{', '.join(lora.TARGETS)})")
    for name in lo.target_names():
        one_of("lora.targets", name, lora.TARGETS)
