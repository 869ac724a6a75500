"""Named algorithm settings (GRPO, DAPO, GSPO, Dr.GRPO) as the FEE reference code runs them
(except DAPO's overlong shaping: the DAPO paper's, which runs only with `rl.overlong_buffer`).

Values follow the FEE reference code (EnvAsScaffold on verl): its batch settings
and loss. Where the reference fixes no value, or the preset is not the reference's, with the source:

- clip_c = 3: verl's PPO loss ("vanilla") always applies the dual clip with clip_ratio_c 3.0,
  so GRPO / DAPO / Dr.GRPO runs on verl have it; verl's GSPO loss has no dual clip (None).
- DAPO's overlong shaping: the reference's DAPO has none (EnvAsScaffold on verl), so a run
  takes its buffer from `rl.overlong_buffer` (default 0: off) and not from this preset. The
  preset's 512 tokens, factor 1.0, is the DAPO paper's reading, scaled to the reference's
  2048-token responses (the paper: a 4096-token buffer for a 20480-token limit, a fifth);
  `rl.overlong_buffer=512` runs it.
- Dr.GRPO (arXiv 2503.20783; verl's recipe: `norm_adv_by_std_in_grpo=False`,
  `loss_agg_mode=seq-mean-token-sum-norm`): mean-only advantage and a constant token
  normaliser; a run sets the preset's `agg_constant` to its max response length.
"""

from __future__ import annotations

import dataclasses

from jaxscaffold.rl.advantages import ESTIMATORS
from jaxscaffold.rl.losses import AGG_MODES, KL_ESTIMATORS, LOSS_MODES, NO_CORRECTION, Correction


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """One RL algorithm: advantage estimator, policy loss and sampling-side tricks. The loss
    (`losses.policy_loss`), the advantages (`advantages.advantages`) and the train step take
    it whole: a preset with the run's overrides (`preset(name, **overrides)`)."""

    name: str
    estimator: str = "grpo"  # advantages(): grpo | drgrpo | rloo
    loss_mode: str = "ppo"  # policy_loss(): ppo | gspo
    clip_low: float = 0.2  # ratio clipped below at 1 - clip_low
    clip_high: float = 0.2  # ratio clipped above at 1 + clip_high (DAPO clip-higher: > clip_low)
    clip_c: float | None = 3.0  # dual-clip bound for A < 0 (ppo only); None = off
    agg: str = "seq-mean-token-mean"  # loss aggregation, see losses.AGG_MODES
    agg_constant: float | None = None  # "seq-mean-token-sum-norm"'s constant (a run: its max response tokens)
    kl_coef: float = 0.0  # KL-to-reference weight in the loss; 0 = no reference model needed
    kl_estimator: str = "k3"  # k1 | k2 | k3 (low_var_kl)
    entropy_coef: float = 0.0  # entropy bonus weight
    dynamic_sampling: bool = False  # DAPO: drop groups whose binary success is all equal
    max_num_gen_batches: int = 10  # generation batches allowed to fill one step's groups
    overlong_buffer: int | None = None  # DAPO overlong shaping buffer in tokens; None = off
    overlong_factor: float = 1.0  # penalty at the length limit (-factor)
    norm_std: bool = True  # divide group-centred scores by the group std (grpo estimator)
    correction: Correction = NO_CORRECTION  # off-policy correction of sampled tokens (TIS, MIS)

    def __post_init__(self):
        for field, value, allowed in (
            ("estimator", self.estimator, ESTIMATORS),
            ("loss_mode", self.loss_mode, LOSS_MODES),
            ("agg", self.agg, AGG_MODES),
            ("kl_estimator", self.kl_estimator, KL_ESTIMATORS),
        ):
            if value not in allowed:
                raise ValueError(f"{self.name}: {field}={value!r} is not one of {allowed}")
        if self.clip_c is not None and (self.loss_mode != "ppo" or self.clip_c <= 1.0):
            raise ValueError(f"{self.name}: clip_c={self.clip_c} needs loss_mode='ppo' and clip_c > 1")
        if self.overlong_buffer is not None and self.overlong_buffer <= 0:
            raise ValueError(f"{self.name}: overlong_buffer must be positive or None")
        if self.agg_constant is not None and self.agg_constant <= 0:
            raise ValueError(f"{self.name}: agg_constant must be positive or None, got {self.agg_constant}")


PRESETS = {
    "grpo": AlgorithmConfig(name="grpo"),
    "dapo": AlgorithmConfig(
        name="dapo",
        clip_high=0.28,
        agg="token-mean",
        dynamic_sampling=True,
        max_num_gen_batches=10,
        overlong_buffer=512,  # the DAPO paper's shaping; off in runs unless rl.overlong_buffer sets it
        overlong_factor=1.0,
    ),
    "gspo": AlgorithmConfig(name="gspo", loss_mode="gspo", clip_low=3e-4, clip_high=4e-4, clip_c=None),
    "drgrpo": AlgorithmConfig(name="drgrpo", estimator="drgrpo", agg="seq-mean-token-sum-norm", norm_std=False),
}


def preset(name: str, **overrides) -> AlgorithmConfig:
    """The named preset with some fields replaced, e.g. `preset("grpo", kl_coef=0.001)`."""
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm preset {name!r}; known: {sorted(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown AlgorithmConfig fields {unknown}; fields: {sorted(fields)}")
    return dataclasses.replace(PRESETS[name], **overrides)
