"""The standard-env arm of the entropy analysis (see entropy_fee.py): standard_sciworld.py for
300 steps without entropy regularisation."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import entropy_fee  # noqa: E402
import standard_sciworld  # noqa: E402


def get_config():
    return entropy_fee.make(standard_sciworld.get_config(), "runs/entropy_standard")
