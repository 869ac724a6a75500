"""The registry's specs (read without importing an env) agree with each env's own splits, and a
split is checked from the spec alone."""

import importlib

import pytest

from jaxscaffold.envs import registry


@pytest.mark.parametrize("name", sorted(registry.ENVS))
def test_split_table_matches_the_env_module(name):
    spec = registry.ENVS[name]
    module = importlib.import_module(spec.module)
    assert callable(getattr(module, spec.catalogue)) and isinstance(getattr(module, spec.env_class), type)
    if name == "sciworld":
        own = module.LEVEL_SPLITS["L0"]  # the default level of `catalogue`
        assert registry.SCIWORLD_LEVEL_SPLITS == module.LEVEL_SPLITS == dict(spec.split_groups)
    elif name == "alfworld":
        own = (*module.SPLITS, *module.SPLIT_ALIASES)
    elif name == "letters":
        own = ("train", "test")
    elif name == "jsonl":  # a split is a path to a .jsonl file
        assert spec.splits is None
        registry.check_split(name, "data/my_tasks.jsonl")
        with pytest.raises(ValueError, match="a path to a .jsonl file"):
            registry.check_split(name, "train")
        return
    else:
        own = module.SPLITS
    assert tuple(spec.splits) == tuple(own)
    if name == "tau2":
        assert registry.TAU2_DOMAINS == module.DOMAINS == tuple(spec.split_groups)


def test_check_split():
    registry.check_split("tau2", "airline/test")
    registry.check_split("sciworld", "L1/test")
    with pytest.raises(ValueError, match="sciworld level L1 has no split 'dev'"):
        registry.check_split("sciworld", "L1/dev")
    with pytest.raises(ValueError, match="tau2 has no domain 'bank'"):
        registry.check_split("tau2", "bank/test")
    with pytest.raises(ValueError, match="bfcl has no split 'test'; splits: train, validation"):
        registry.check_split("bfcl", "test")
