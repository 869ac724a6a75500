"""The typed run config: every config file builds; every bad field or value is one clear error."""

import dataclasses
import glob
import os
import subprocess
import sys
import time

import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.config import ConfigError
from jaxscaffold.feedback import enrichers, randomization, schedule
from jaxscaffold.models import config as model_configs
from jaxscaffold.rl import presets
from jaxscaffold.train import config_checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))
CONFIGS += [os.path.join(ROOT, "configs", f"pilot.py:{v}") for v in ("ag_early", "ag_late", "oe_early", "oe_late")]


def base():
    return config_lib.load_file(os.path.join(ROOT, "configs", "base.py"))


def rwml():
    return config_lib.load_file(os.path.join(ROOT, "configs", "rwml.py"))


def build(cd, *overrides):
    return config_checks.checked(config_lib.parse_overrides(cd, list(overrides)))


# What a config file leaves for its user to fill in (its docstring says so).
REQUIRED = {"rwml_tau2.py": ["envs.tau2_user.hf_path=/ckpt/Qwen3-8B"],  # (the embedder is the offline MiniLM)
            "rwml_policy_tau2.py": ["envs.tau2_user.hf_path=/ckpt/Qwen3-8B"]}


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_config_file_builds_and_round_trips(path):
    required = REQUIRED.get(os.path.basename(path), [])
    if required:
        with pytest.raises(ConfigError, match=required[0].split("=")[0]):
            build(config_lib.load_file(path))
    cfg = build(config_lib.load_file(path), *required)
    assert config_lib.from_dict(cfg.to_dict()) == cfg
    assert (cfg.rwml is not None) == (cfg.job == "rwml")


# (field, a bad value, the allowed values the message must list): one case per enum.
ENUMS = [
    ("rl.algorithm", "ppo", sorted(presets.PRESETS)),
    ("feedback.schedule", "ag_erly", [*schedule.NAMES, "bandit"]),
    ("feedback.mode", "groups", list(randomization.MODES)),
    ("feedback.ag_form", "papers", enrichers.form_names("ag")),
    ("feedback.oe_form", "list", enrichers.form_names("oe")),
    ("feedback.bandit_signal", "reward", ["informative", "success"]),
    ("rollout.representation", "traj", ["trajectory", "stepwise"]),
    ("model.preset", "qwen4-4b", ["tiny", *model_configs.PRESETS]),
    ("model.param_dtype", "fp32", list(config_lib.DTYPES)),
    ("model.compute_dtype", "bf16", list(config_lib.DTYPES)),
    ("model.cache_dtype", "int8", list(config_lib.DTYPES)),
    ("model.remat_policy", "some", ["none", "full", "save_dots"]),
    ("job", "ppo", ["rl", "rwml"]),
    ("envs.train", "nosuchenv", ["letters", "sciworld", "bfcl", "alfworld", "tau2"]),
    ("envs.eval", "sciworld,bfcl:valid", ["train", "validation"]),
    ("envs.train_split", "tset", ["train", "test"]),
]
RWML_ENUMS = [
    ("rwml.objective", "ppo", ["rl", "sft"]),
    ("rwml.collect_policy", "random", ["model", "explore"]),
    ("rwml.reward", "judge", ["embedding", "embedding_facts", "judge_binary", "judge_continuous"]),
    ("rwml.embedder", "bert", ["minilm", "qwen3"]),
]


@pytest.mark.parametrize("field, bad, allowed", ENUMS + RWML_ENUMS, ids=[e[0] for e in ENUMS + RWML_ENUMS])
def test_a_bad_enum_names_the_field_and_the_allowed_values(field, bad, allowed):
    cd = rwml() if field.startswith("rwml.") else base()
    with pytest.raises(ConfigError) as e:
        build(cd, f"{field}={bad}")
    msg = str(e.value)
    assert "\n" not in msg and field.split(".")[0] in msg and repr(bad.split(",")[-1].split(":")[-1]) in msg
    for value in allowed:
        assert value in msg, (value, msg)


def test_bandit_arms_are_schedules():
    with pytest.raises(ConfigError, match=r"feedback.bandit_arms='ag_erly' is not one of: none"):
        build(base(), "feedback.schedule=bandit", "feedback.bandit_arms=none,ag_erly")
    assert build(base(), "feedback.schedule=bandit").feedback.arms()[0] == "none"


@pytest.mark.parametrize("override, match", [
    ("stepz=3", r"unknown config field stepz \(did you mean steps\?\)"),
    ("rl.lrr=1e-6", r"unknown config field rl.lrr \(did you mean lr\?\)"),
    ("rll.lr=1e-6", r"unknown config field rll \(did you mean rl\?\)"),
    ("rl=3", r"config.rl is a section"),
    ("steps=ten", r"config.steps='ten' must be a int"),
    ("rollout.enable_thinking=maybe", r"must be a bool"),
    ("steps", r"has no value"),
])
def test_overrides_are_checked_against_the_schema(override, match):
    with pytest.raises(ConfigError, match=match):
        build(base(), override)


def test_overrides_are_parsed_as_their_fields_type():
    cfg = build(base(), "steps=7", "rl.lr=3e-2", "rollout.enable_thinking=false", "envs.train=letters",
                "rollout.top_p=1")
    assert (cfg.steps, cfg.rl.lr, cfg.rollout.enable_thinking, cfg.envs.train) == (7, 0.03, False, "letters")
    assert isinstance(cfg.rollout.top_p, float)


@pytest.mark.parametrize("override, match", [
    ("feedback.probability=1.5", r"feedback.probability=1.5 must be >= 0.0 and <= 1.0"),
    ("rollout.max_len=512", r"rollout.max_len=512 must exceed rollout.max_new_tokens=512"),
    ("rollout.group_size=0", r"rollout.group_size=0 must be >= 1"),
    ("rl.lr=0", r"rl.lr=0.0 must be > 0.0"),
    ("mesh.fsdp=-1", r"at most one of data / fsdp / tensor may be -1"),
    ("mesh.tensor=0", r"mesh.tensor=0 must be >= 1"),
    ("envs.eval=letters:test:x", r"config.envs.eval: task spec entry .* is not an integer"),
    ("envs.env_kwargs={bad", r"env_kwargs is not JSON"),
    ('envs.env_kwargs={"tau3": {}}', r"env_kwargs \(environment\)='tau3' is not one of"),
    ("eval.max_len=100", r"eval.max_len=100 must be 0"),
    ("eval.tasks=-1", r"eval.tasks=-1 must be >= 0"),
    ("eval.batch_size=-2", r"eval.batch_size=-2 must be >= 0"),
    ("eval.at_start=maybe", r"must be a bool"),
    ("rollout.sampler_devices=-1", r"rollout.sampler_devices=-1 must be >= 0"),
    ("rollout.max_rows_in_flight=-1", r"rollout.max_rows_in_flight=-1 must be >= 0"),
    ("rollout.max_rows_in_flight=4", r"max_rows_in_flight=4 must be 0 \(all rows at once\) or at least rollout.group_size=8"),
])
def test_ranges_and_dependent_fields(override, match):
    with pytest.raises(ConfigError, match=match):
        build(base(), override)


def test_rwml_ranges():
    with pytest.raises(ConfigError, match=r"rwml.epochs=-1.0 must be >= 0.0"):
        build(rwml(), "rwml.epochs=-1")
    assert build(rwml(), "rwml.epochs=0.5").rwml.epochs == 0.5


def test_dict_form_is_checked_like_the_configdict():
    d = base().to_dict()
    d["rl"]["lr"] = "fast"
    with pytest.raises(ConfigError, match=r"config.rl.lr='fast' must be a float"):
        config_lib.from_dict(d)
    d = base().to_dict()
    del d["eval"]["every"]
    with pytest.raises(ConfigError, match=r"config.eval.every is missing"):
        config_lib.from_dict(d)
    d = base().to_dict()
    d["job"] = "rwml"
    with pytest.raises(ConfigError, match=r"needs the rwml section"):
        config_lib.from_dict(d)


def test_the_tree_is_frozen():
    cfg = build(base())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rl.lr = 1.0


@pytest.mark.parametrize("args, match", [
    (["--config.rl.algorithm=ppo"], "config.rl.algorithm='ppo' is not one of: dapo, drgrpo, grpo, gspo"),
    (["--config.feedback.schedule=ag_erly"], "config.feedback.schedule='ag_erly' is not one of"),
    (["--config.rollout.representation=traj"], "config.rollout.representation='traj' is not one of: trajectory, stepwise"),
    (["--config.stepz=3"], "unknown config field stepz (did you mean steps?)"),
])
def test_the_launcher_refuses_a_bad_config_in_one_line_within_seconds(args, match):
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "tpu_train.py"), "--config", "tiny.py", *args],
                         capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - t0
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [f"error: {match}"] or match in out.stderr and \
        len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert elapsed < 15, elapsed  # before any model is built (jax's import is most of it)


@pytest.mark.parametrize("args, match", [
    (["--config.model.hf_path=/nonexistent/ckpt"], "checkpoint directory not found: /nonexistent/ckpt"),
    (["--config.envs.train=jsonl:/nonexistent/tasks.jsonl"], "tasks jsonl:/nonexistent/tasks.jsonl: jsonl task file not found"),
])
def test_the_launcher_reports_bad_input_found_at_start_in_one_line(args, match, tmp_path, monkeypatch, capsys):
    """(tpu_train.py's main in this process, saving a process start; the test above and
    tests/train/test_startup.py run it as a command.)"""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "launch"))
    import tpu_train
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        tpu_train.main(["--config", "tiny.py", f"--config.out_dir={tmp_path}", "--config.envs.num_workers=0", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and match in err, err[-2000:]


def test_the_launcher_help_lists_every_field_with_its_value_and_comment():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "tpu_train.py"), "--config", "rwml_tiny.py",
                          "--config.steps=3", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("  --config.")]
    cfg = build(config_lib.load_file(os.path.join(ROOT, "configs", "rwml_tiny.py")))

    def count(d):
        return sum(count(v) if isinstance(v, dict) else 1 for v in d.values())
    assert len(lines) == count(cfg.to_dict())
    assert all("  # " in line for line in lines), [line for line in lines if "  # " not in line]
    assert "  --config.steps=3  # training steps" in out.stdout


# The reference run's update fields: enum, ranges and the fields they depend on.
@pytest.mark.parametrize("overrides, match", [
    (["rl.dynamic_sampling_exhausted=stop"], r"rl.dynamic_sampling_exhausted='stop' is not one of: continue, raise"),
    (["rl.minibatch_rows=-1"], r"rl.minibatch_rows=-1 must be >= 0"),
    (["rl.minibatch_rows=128", "rl.num_minibatches=2"], r"minibatch_rows=128 sets the mini-batches by rows"),
    (["rl.tis_cap=-1", "rl.recompute_old_logprobs=true"], r"rl.tis_cap=-1.0 must be >= 0.0"),
    (["rl.tis_cap=2"], r"rl.tis_cap=2.0 .* needs rl.recompute_old_logprobs=True"),
])
def test_the_update_fields_are_checked(overrides, match):
    with pytest.raises(ConfigError, match=match):
        build(base(), *overrides)
    cfg = build(base(), "rl.tis_cap=2", "rl.recompute_old_logprobs=true", "rl.minibatch_rows=128",
                "rl.dynamic_sampling_exhausted=raise")
    assert (cfg.rl.tis_cap, cfg.rl.recompute_old_logprobs, cfg.rl.minibatch_rows) == (2.0, True, 128)


@pytest.mark.parametrize("overrides, match", [
    (["model.vocabulary=kitchen"], r"config.model.vocabulary='kitchen' is not one of: , rooms"),
    (["model.vocabulary=rooms", "model.tokenizer=/tok"], r"model.vocabulary='rooms' and config.model.tokenizer='/tok': set one"),
])
def test_word_vocabulary_is_checked(overrides, match):
    with pytest.raises(ConfigError, match=match):
        build(base(), *overrides)
    assert build(base(), "model.vocabulary=rooms").model.vocabulary == "rooms"


def test_config_imports_nothing_from_the_package():
    """config.py is the bottom of the package: the names other modules define are checked by
    those modules (train/config_checks), so every import of config.py is third-party or stdlib."""
    import ast
    with open(os.path.join(ROOT, "jaxscaffold", "config.py")) as f:
        tree = ast.parse(f.read())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert imported and not [m for m in imported if m == "jaxscaffold" or m.startswith("jaxscaffold.")], imported
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], "relative import"


def test_every_field_is_declared_once_with_a_description():
    """base.py is the declarations' defaults; each leaf has a one-line description, and a
    default of its type within its own choices and range (the declarations check themselves)."""
    fields = config_lib.declarations()
    assert len(fields) > 120
    assert base().to_dict() == config_lib.defaults().to_dict()
    assert rwml().rwml.to_dict() == config_lib.defaults(config_lib.RWML).to_dict()
    for name, (hint, f) in fields.items():
        assert f.metadata["help"].strip() and "\n" not in f.metadata["help"], name
        assert isinstance(f.default, hint) and not (hint is int and isinstance(f.default, bool)), name
        assert f.metadata["choices"] is None or f.default in f.metadata["choices"], name
    assert config_lib.from_configdict(config_lib.defaults()).to_dict() == base().to_dict() | {"rwml": None}
    # base.py declares nothing itself: a field is added in one place, config.py
    with open(os.path.join(ROOT, "configs", "base.py")) as f:
        text = f.read()
    assert "c." not in text and "ConfigDict()" not in text


def test_checks_of_names_are_the_subsystems_not_the_types():
    """A name another module defines passes the typed config and is refused by config_checks."""
    cd = config_lib.parse_overrides(base(), ["rl.algorithm=ppo"])
    cfg = config_lib.from_configdict(cd)
    with pytest.raises(ConfigError, match="config.rl.algorithm='ppo' is not one of"):
        config_checks.check(cfg)


@pytest.mark.parametrize("flag", ["--help", "--helpfull"])
def test_the_help_shows_type_allowed_values_and_default_from_the_declarations(flag):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "tpu_train.py"), "--config", "pilot.py:ag_late",
                          "--config.steps=3", flag], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "  --config.steps=3  # training steps (one rollout batch + its optimizer steps each) [int >= 1; default 200]" \
        in out.stdout
    assert "  --config.feedback.schedule='ag_late'  # " in out.stdout  # the variant's value
    assert "[str: 'trajectory' | 'stepwise'; default 'trajectory']" in out.stdout
    assert "  --config.rwml=None  # world-model RL" in out.stdout


def test_the_command_line_parses_like_ml_collections_flags():
    """`--config.FIELD VALUE` (space), a bare boolean flag, and a variant's config string."""
    cd = config_lib.load_file(config_lib.config_path("pilot.py:oe_late", os.path.join(ROOT, "configs")))
    assert cd.feedback.schedule == "oe_late"
    cfg, rest, show_help = config_lib.from_command_line(
        ["--config", "tiny", "--config.steps", "4", "--config.rollout.lockstep", "--other", "x"],
        os.path.join(ROOT, "configs"))
    assert (cfg.steps, cfg.rollout.lockstep, rest, show_help) == (4, True, ["--other", "x"], False)
    with pytest.raises(ConfigError, match="need --config NAME_OR_PATH first"):
        config_lib.from_command_line(["--config.steps=4"], os.path.join(ROOT, "configs"))


def test_a_saved_config_from_before_a_field_was_declared_still_reads():
    """A checkpoint's config lacks the fields declared since it was saved: they take their
    defaults (eval and export of older runs); its other values and checks stay as saved."""
    from configs import tiny
    saved = config_lib.from_configdict(tiny.get_config()).to_dict()
    del saved["rl"]["mis"], saved["rollout"]["lockstep"]
    saved["rl"]["lr"] = 3e-4
    cfg = config_lib.from_configdict(config_lib.saved(saved))
    assert cfg.rl.mis == "off" and cfg.rollout.lockstep is False and cfg.rl.lr == 3e-4
    saved["rl"]["lrr"] = 1.0  # an unknown field is still refused
    with pytest.raises(config_lib.ConfigError, match="did you mean lr"):
        config_lib.from_configdict(config_lib.saved(saved))
