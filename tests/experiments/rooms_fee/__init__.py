import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def script(name: str):
    """experiments/rooms_fee/NAME.py as a module (the experiments are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "experiments", "rooms_fee", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
