from tests.envs.conftest import alfworld_data  # noqa: F401  (shared fixtures)
