"""Loading a `configs/` file with dotted overrides, as `--config.a.b=v` would (tests only)."""

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
