"""RWML's premise on the rooms testbed, measured: `python experiments/rooms_rwml/premise.py RUN_DIR [RUN_DIR ...]
--out JSON [--prompts M] [--group G]`.

RWML's GRPO learns only from groups whose sampled answers get both rewards. For each saved
step of each warm-up build (RUN_DIR: experiments/rooms_rwml/base.py's OUT_DIR/run, built with
`--params-every`), this samples G answers (the RL stage's sampler: configs/rwml_rooms.py's
`rollout` settings, temperature 1) to each of M held-out world-model prompts (explorer triples of
test-split layouts, which no warm-up trains on; `history_window` 1 as stage 1), scores each as
stage 1 does (the `lines` reward at `rwml.tau_d`: every line of the true next state right) and
reports p_exact (the share of answers rewarded), the share of groups with mixed rewards and its
Clopper-Pearson 95% interval, split also by whether the action leaves the state unchanged (the
copy's only exact cases). It also reports, teacher-forced, each prompt's probability q that the
sampler writes exactly the true answer (`exact_answer_logprobs`) and the mixed share that q
implies (`expected_mixed_share`): smooth where G samples read 0. A rerun with the same --out
measures only the steps not yet in it. docs/studies/rwml_premise.md reads the results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion k / n."""
    from scipy.stats import beta

    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    alpha = 1.0 - level
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def group_statistics(rewards) -> dict:
    """Of a (groups, G) array of 0/1 rewards: p_exact (the share of answers rewarded), the groups
    with mixed rewards (both a 0 and a 1: a nonzero GRPO advantage) and their share with its
    Clopper-Pearson 95% interval."""
    r = np.asarray(rewards, dtype=float)
    if r.ndim != 2 or r.shape[0] < 1 or r.shape[1] < 2 or not np.isin(r, (0.0, 1.0)).all():
        raise ValueError(f"need a (groups >= 1, G >= 2) array of 0/1 rewards, got shape {r.shape}")
    mixed = int(np.sum((r.min(axis=1) == 0) & (r.max(axis=1) == 1)))
    lo, hi = clopper_pearson(mixed, r.shape[0])
    return {"groups": int(r.shape[0]), "group_size": int(r.shape[1]), "p_exact": float(r.mean()),
            "mixed_groups": mixed, "mixed_share": mixed / r.shape[0], "mixed_share_ci95": [lo, hi]}


def heldout_prompts(cfg, n: int, seed: int):
    """n explorer triples (true next states) of the test split's layouts, seeded, all layouts
    drawn from (each explorer episode gives ~11 transitions)."""
    from experiments.rooms_rwml.base import copy_triples

    triples = copy_triples(cfg, "test", max(1, -(-n // 6)), seed, copy=False)
    if len(triples) < n:
        raise ValueError(f"only {len(triples)} held-out triples for {n} prompts")
    order = np.random.default_rng(seed).permutation(len(triples))[:n]
    return [triples[i] for i in sorted(order)]


def exact_answer_logprobs(job, params, triples, *, chunk: int = 16) -> np.ndarray:
    """log P(the RL sampler writes exactly the true next state's answer: tags, state, end id),
    teacher-forced, per triple. At temperature 1 without nucleus or top-k cut (the stage's
    sampling) this is the sampling probability of that one answer, a lower bound on p_exact
    (the same lines reordered or respaced also score), and far less noisy than G samples."""
    import jax
    import jax.numpy as jnp

    from jaxscaffold.models import qwen3
    from jaxscaffold.models.chat import Qwen3ChatRenderer
    from jaxscaffold.train.workloads.world_model import answered_conversation, prompt_config

    s = job.sampler.sampling
    if s.temperature != 1.0 or s.top_p != 1.0 or s.top_k:
        raise ValueError(f"the teacher-forced probability is the sampling one only at temperature 1, no cuts ({s})")
    chat, pcfg = Qwen3ChatRenderer(job.tokenizer), prompt_config(job.cfg)
    convs = [answered_conversation(chat, t, pcfg) for t in triples]
    width = max(len(c.ids) for c in convs)
    out = []
    for start in range(0, len(convs), chunk):
        part = convs[start:start + chunk]
        tokens = np.zeros((chunk, width), np.int32)  # right padding: no effect on earlier positions
        mask = np.zeros((chunk, width), bool)
        for r, c in enumerate(part):
            tokens[r, :len(c.ids)], mask[r, :len(c.ids)] = c.ids, np.asarray(c.assistant_mask, bool)
        logp = jax.nn.log_softmax(qwen3.forward(params, job.model_config, jnp.asarray(tokens)), axis=-1)
        # position t's logits predict token t + 1
        taken = np.asarray(jnp.take_along_axis(logp[:, :-1], jnp.asarray(tokens[:, 1:, None]), axis=-1)[..., 0])
        out += list(np.where(mask[:, 1:], taken, 0.0).sum(axis=1)[:len(part)])
    return np.asarray(out)


def expected_mixed_share(q, group: int) -> float:
    """The mean over prompts of P(a group of `group` independent answers has both outcomes),
    each prompt's answers exact with probability q: 1 - q^G - (1 - q)^G."""
    q = np.asarray(q, dtype=float)
    return float(np.mean(1.0 - q ** group - (1.0 - q) ** group))


def measure(job, params, triples, *, group: int, seed: int) -> dict:
    """`group_statistics` of `group` sampled answers to each triple (the job's RL sampler),
    scored by the `lines` reward at the job's `rwml.tau_d`; also by unchanged / changed state,
    the parsed share and the parsed answers' mean line distance."""
    from jaxscaffold.train.workloads.world_model import sample_answers
    from jaxscaffold.worldmodel.line_reward import line_rewards_with_counts
    from jaxscaffold.worldmodel.reward import MAX_DISTANCE

    answers = sample_answers(job, params, triples, samples=group, seed=seed)
    targets = [t.next_state for t in triples for _ in range(group)]
    rewards, distances, _ = line_rewards_with_counts([a for _, a in answers], targets, job.cfg.rwml.tau_d)
    rewards = rewards.reshape(len(triples), group)
    parsed = distances < MAX_DISTANCE
    unchanged = np.array([t.next_state.strip() == t.observation.strip() for t in triples])
    out = group_statistics(rewards)
    out.update(parsed=float(parsed.mean()),
               mean_distance=float(distances[parsed].mean()) if parsed.any() else MAX_DISTANCE,
               unchanged_share=float(unchanged.mean()))
    for name, rows in (("unchanged", unchanged), ("changed", ~unchanged)):
        if rows.any():
            part = group_statistics(rewards[rows])
            out[name] = {k: part[k] for k in ("groups", "p_exact", "mixed_share")}
    logq = exact_answer_logprobs(job, params, triples)
    q = np.exp(logq)
    out["teacher_forced"] = {"p_exact_lower": float(q.mean()), "median_logq": float(np.median(logq)),
                             "median_logq_changed": float(np.median(logq[~unchanged])) if (~unchanged).any() else None, "expected_mixed_share": expected_mixed_share(q, group),
                             "expected_mixed_share_g8": expected_mixed_share(q, 8),
                             "prompts_q_over_0.05": float(np.mean(q > 0.05))}
    out["example"] = answers[0][1][:120]
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="warm-up runs (experiments/rooms_rwml/base.py's OUT_DIR/run)")
    p.add_argument("--out", required=True, help="JSON to write (rewritten after each step measured)")
    p.add_argument("--prompts", type=int, default=64, help="held-out prompts M (groups)")
    p.add_argument("--group", type=int, default=4, help="answers a prompt G")
    p.add_argument("--steps", default="", help="comma-separated steps to read (default: every saved one)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.prompts < 1 or args.group < 2:
        print("error: --prompts must be >= 1 and --group >= 2", file=sys.stderr)
        return 2

    import jax

    from jaxscaffold import config as config_lib
    from jaxscaffold.train.checkpoint import PARAMS_DIR, CheckpointNotFound, find_params, saved_steps
    from jaxscaffold.train.export import read_policy
    from jaxscaffold.train.job import build_job

    cd = config_lib.load_file(config_lib.config_path("rwml_rooms.py", os.path.join(ROOT, "configs")))
    results = {}
    if os.path.exists(args.out):  # a rerun measures only the steps not yet in it
        with open(args.out) as f:
            results = json.load(f)
    for run in args.runs:
        base_dir = os.path.dirname(os.path.normpath(run))  # the build's export: its model for the job's shapes
        try:
            steps = sorted({*saved_steps(os.path.join(run, PARAMS_DIR)), find_params(run)[1]})
        except (CheckpointNotFound, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if args.steps:
            steps = [s for s in steps if str(s) in args.steps.split(",")]
        cfg = config_lib.from_configdict(config_lib.parse_overrides(
            cd, [f"model.hf_path={base_dir}", f"seed={args.seed}", "mesh.devices=1"]))
        job, state = build_job(cfg)
        del state
        triples = heldout_prompts(cfg, args.prompts, args.seed + 1)
        entry = results.setdefault(base_dir, {"model": {"layers": job.model_config.num_layers,
                                                        "hidden": job.model_config.hidden_size,
                                                        "parameters": None}, "steps": {}})
        for step in steps:
            if str(step) in entry["steps"]:
                continue
            _, _, params, _ = read_policy(run, step)
            entry["model"]["parameters"] = int(sum(np.size(x) for x in jax.tree.leaves(params)))
            entry["steps"][str(step)] = measure(job, params, triples, group=args.group, seed=args.seed)
            print(f"{base_dir} step {step}: " + json.dumps({k: v for k, v in entry["steps"][str(step)].items()
                                                            if k != "example"}), flush=True)
            with open(args.out + ".tmp", "w") as f:
                json.dump(results, f, indent=1)
            os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
