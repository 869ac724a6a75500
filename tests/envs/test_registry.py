"""The registry's specs (each declared beside its env, listed without any optional dependency)
agree with each env's own splits, and a split is checked from the spec alone."""

import importlib
import subprocess
import sys

import pytest

from jaxscaffold.envs import registry


@pytest.mark.parametrize("name", sorted(registry.ENVS))
def test_split_table_matches_the_env_module(name):
    spec = registry.ENVS[name]
    module = importlib.import_module(spec.module)
    assert callable(getattr(module, spec.catalogue)) and isinstance(getattr(module, spec.env_class), type)
    declared = importlib.import_module("jaxscaffold.envs.tau2_spec") if name == "tau2" else module
    assert declared.SPEC is spec  # the env's own declaration, listed as is
    if name == "sciworld":
        own = module.LEVEL_SPLITS["L0"]  # the default level of `catalogue`
        assert {"official", "L0", "L1", "L2"} == set(module.LEVEL_SPLITS) == set(spec.split_groups)
        assert module.LEVEL_SPLITS == dict(spec.split_groups)
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
        assert ("retail", "airline", "telecom") == module.DOMAINS == tuple(spec.split_groups)


def test_the_registry_imports_no_optional_dependency():
    """Listing the envs (what a config check does) imports none of their optional packages."""
    optional = ("tau2", "scienceworld", "textworld", "alfworld", "bfcl_eval", "jaxscaffold.envs.tau2")
    code = ("import sys; from jaxscaffold.envs import registry; "
            f"print(sorted(registry.ENVS), [m for m in {optional!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    built_in = ["alfworld", "bfcl", "jsonl", "latency", "letters", "rooms", "sciworld", "tau2"]
    assert out.strip() == f"{built_in} []"


def test_an_env_with_options_is_built_from_the_run_kwargs():
    """BFCL's constructor takes one options object; the registry (and a pool worker, through the
    same import path) builds it from the run's kwargs, and a wrong kwarg is refused."""
    from jaxscaffold.envs import bfcl

    assert registry.import_path("bfcl") == "jaxscaffold.envs.bfcl:BFCLEnv.from_kwargs"
    env = registry.factory("bfcl", tool_format="python", max_total_steps=3)()
    assert isinstance(env, bfcl.BFCLEnv)
    assert env.options == bfcl.BFCLOptions(tool_format="python", max_total_steps=3)
    with pytest.raises(TypeError, match="tool_formats"):
        registry.factory("bfcl", tool_formats="python")()
    with pytest.raises(ValueError, match="'xml' is not one of"):
        bfcl.BFCLOptions(tool_format="xml")


def test_check_split():
    registry.check_split("tau2", "airline/test")
    registry.check_split("sciworld", "L1/test")
    with pytest.raises(ValueError, match="sciworld level L1 has no split 'dev'"):
        registry.check_split("sciworld", "L1/dev")
    with pytest.raises(ValueError, match="tau2 has no domain 'bank'"):
        registry.check_split("tau2", "bank/test")
    with pytest.raises(ValueError, match="bfcl has no split 'test'; splits: train, validation"):
        registry.check_split("bfcl", "test")
