"""tau2-bench's `EnvSpec`, apart from `envs.tau2`, whose import needs the optional `tau2`
extra: the registry lists the env (and checks its splits) without it."""

from jaxscaffold.envs.base import EnvSpec

DOMAINS = ("retail", "airline", "telecom")
SPLITS = ("train", "test", "base")  # tau2's split_tasks.json names; "base" = train + test

# "retail/test": a domain and its split; a bare split is every domain's.
SPEC = EnvSpec("tau2", "jaxscaffold.envs.tau2", "Tau2Env", splits=SPLITS, split_groups={d: () for d in DOMAINS},
               group_label="domain", extra="tau2")
