"""Each config file writes to its own out_dir, so runs of different configs (the demo, then the
README's examples, in any order) never meet as a "changed resume" in one directory."""

import collections
import glob
import importlib.util
import os

from jaxscaffold import config as config_lib
from jaxscaffold.train import config_checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_no_two_config_files_share_an_out_dir():
    by_dir = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))):
        by_dir[os.path.normpath(_config(path).out_dir)].append(os.path.basename(path))
    shared = {d: names for d, names in by_dir.items() if len(names) > 1}
    assert not shared, shared


def test_the_jsonl_example_config_is_the_demo_on_the_users_tasks():
    tiny = config_lib.typed(_config(os.path.join(ROOT, "configs", "tiny.py")))
    jsonl = config_lib.typed(_config(os.path.join(ROOT, "configs", "tiny_jsonl.py")))
    config_lib.validate(jsonl)
    config_checks.check(jsonl)  # and the names other modules define
    assert jsonl.out_dir != tiny.out_dir
    assert jsonl.envs.train == jsonl.envs.eval == "jsonl:my_tasks.jsonl"
    assert jsonl.model == tiny.model and jsonl.rollout == tiny.rollout and jsonl.steps == tiny.steps
