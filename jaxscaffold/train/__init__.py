"""The training job, wiring models, rollouts, environments, feedback and RL.

`job` builds the model side (`build_job`), `trainer` runs the loop (`train`), `update` the
optimizer steps of a step, `workloads/` what a step collects and how it is evaluated (task RL
on environments, RWML's world model), `tasks` / `envs` where tasks and environments come from,
`metrics` / `logger` / `checkpoint` / `export` what a run leaves, `multihost` what several
processes add, `memory_plan` what a config needs of a device's memory.
"""
