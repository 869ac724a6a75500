from tests.envs.conftest import alfworld_data, alfworld_tarball  # noqa: F401  (shared fixtures)
