"""Loading a `configs/` file with dotted overrides, as `--config.a.b=v` would, and the tests'
small version of the tiny config (tests only)."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_config(name: str, **overrides):
    """configs/<name>.py's config with `{"rollout.max_len": 512, ...}` applied."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.get_config()
    apply_overrides(cfg, overrides)
    return cfg


def apply_overrides(cfg, overrides: dict) -> None:
    for k, v in overrides.items():
        node = cfg
        *path, last = k.split(".")
        for p in path:
            node = node[p]
        node[last] = v


# The `rooms` word-level vocabulary (~270 ids) instead of Qwen3's 151,936, which is 9.7M of the
# tiny model's ~10M parameters and most of its compute (embedding and LM head). For tests of
# plumbing (checkpoints, resume, metrics, schedules, faults) that no property of Qwen3's
# tokenizer enters: letters and the toy envs reward any decoded text, and other words decode
# as one unknown id.
WORDS = {"model.vocabulary": "rooms"}


def word_model(**tiny_kwargs):
    """The rooms word tokenizer and the tiny model config sized to it (`WORDS`' vocabulary, for
    tests that build a sampler or model directly rather than through `tiny_config`)."""
    from jaxscaffold.models import config as model_config
    from jaxscaffold.models.word_tokenizer import padded_vocab_size
    from jaxscaffold.train.vocabularies import word_tokenizer
    tok = word_tokenizer(WORDS["model.vocabulary"])
    return tok, model_config.tiny(vocab_size=padded_vocab_size(tok), **tiny_kwargs)


def tiny_config(out_dir, *, real_eval: bool = False, words: bool = False, **overrides):
    """configs/tiny.py made smaller for tests: in-process envs, one of the 8 test devices (8
    data-parallel replicas of the parameters and their update would only repeat the work on the
    machine's cores; the smoke test and the multi-host ones train on several), no evaluation
    before training, and (unless
    `real_eval`) letters instead of the ScienceWorld / BFCL evaluation. `words`: the model on
    the `rooms` word vocabulary (`WORDS`), not Qwen3's, for tests the vocabulary plays no part in."""
    cfg = load_config("tiny")
    cfg.out_dir = str(out_dir)
    cfg.rollout.tasks_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens = 2, 4, 8
    cfg.envs.num_workers = 0
    cfg.mesh.devices = 1
    cfg.eval.at_start = False  # no step-0 evaluation: tests that want one ask for it
    cfg.checkpoint.keep = 3  # the base's: resume and fallback tests need earlier checkpoints (the demo keeps 1)
    if not real_eval:
        cfg.envs.eval, cfg.eval.tasks, cfg.eval.max_len = "letters", 4, 0
    if words:
        apply_overrides(cfg, WORDS)
    apply_overrides(cfg, overrides)
    return cfg
