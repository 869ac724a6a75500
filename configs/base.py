"""What every config starts from: the declared default of each field. Each field is declared
once, with its type, allowed values and description, in jaxscaffold/config.py (list them with
`python launch/tpu_train.py --config base.py --help`); each experiment file overrides what it
changes."""

from jaxscaffold import config


def get_config():
    return config.defaults()
