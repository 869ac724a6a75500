"""RWML, stage 1: world-model RL. The policy learns to predict the environment's next state.

  rollouts of the initial policy (or a scripted explorer) -> triples (history, action, next state)
  -> held-out split -> difficulty filter (a light SFT'd predictor samples K answers; easy triples
  mostly dropped) -> GRPO on `<next_state>` answers rewarded by embedding distance (d < tau_d),
  KL to the initial policy -> evaluation: world-model accuracy on held-out triples -> HF export.

The trainer runs stage 1 (`job = "rwml"`: `WorldModelWorkload`) and exports its final
parameters to `rwml.export_dir` (default out_dir/hf); stage 2 is ordinary task RL from that
export (`configs/rwml_policy.py`). The WM-SFT baseline (`rwml.objective = "sft"`:
`WorldModelSFT`) fits the same triples with token-level cross-entropy instead.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxscaffold import seeds
from jaxscaffold.envs.base import Task
from jaxscaffold.episodes.agents import ExplorerAgent, ModelAgent, RolloutConfig
from jaxscaffold.episodes.driver import complete, run_episodes
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_sft_step
from jaxscaffold.rollout.conversation import Conversation
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig
from jaxscaffold.train.envs import make_envs
from jaxscaffold.train.evaluation import breakdown
from jaxscaffold.train.job import Job
from jaxscaffold.train.logger import MetricLogger
from jaxscaffold.train.metrics import rollout_metrics
from jaxscaffold.train.multihost import allgather_json, process_share, sampler_params
from jaxscaffold.train.tasks import TaskStream, env_names, load_tasks
from jaxscaffold.train.workloads.base import register_workload
from jaxscaffold.train.workloads.sft import sft_update, single_process
from jaxscaffold.worldmodel import difficulty, line_reward, reward as reward_lib, task as task_lib, triples as triples_lib
from jaxscaffold.worldmodel.embedders import make_embedder
from jaxscaffold.worldmodel.triples import Triple

log = logging.getLogger(__name__)

DATA_FILE = "triples.jsonl"  # the prepared data set; a resumed run reads it instead of recollecting


# ----------------------------------------------------------------------------- trajectories


def _collect_tasks(cfg) -> list[Task]:
    tasks = load_tasks(cfg.envs.train, cfg.envs.train_split)
    order = np.random.default_rng(seeds.derive(cfg.seed, "collect_tasks")).permutation(len(tasks))
    order = order[: cfg.rwml.collect_tasks]
    return [tasks[i] for i in order]


def policy_trajectories(job: Job, params, envs, tasks: Sequence[Task]) -> list[Episode]:
    """N rollouts per task of the current policy (the paper's way; temperature from rwml)."""
    w = job.cfg.rwml
    rcfg = RolloutConfig(max_turns=w.collect_max_turns, max_new_tokens=job.cfg.rollout.max_new_tokens,
                         enable_thinking=job.cfg.rollout.enable_thinking)
    sampler = Sampler(job.model_config, batch_size=job.sampler.batch_size, max_len=job.cfg.rollout.max_len,
                      stop_ids=job.sampler.stop_ids, mesh=job.sampler.mesh, rules=job.sampler.rules,
                      options=SamplerOptions(sampling=SamplingConfig(temperature=w.collect_temperature),
                                             cache_dtype=job.cfg.model.cache_dtype))
    params = sampler_params(params, sampler)
    flat = [t for t in tasks for _ in range(w.rollouts_per_task)]
    episodes = []
    # Chunks of the sampler's slots: each chunk's seed derives from its start (as it always has).
    for start in range(0, len(flat), sampler.batch_size):
        chunk = flat[start:start + sampler.batch_size]
        agent = ModelAgent(params, sampler, job.tokenizer, rcfg, seed=seeds.derive(job.cfg.seed, "collect", start),
                           train_step=0)
        episodes += run_episodes(agent, envs, chunk, max_turns=rcfg.max_turns, lockstep=job.cfg.rollout.lockstep,
                                 decode_chunk=job.cfg.rollout.decode_chunk,
                                 admit_wait_ms=job.cfg.rollout.admit_wait_ms)
    return episodes


def explorer_trajectories(envs, tasks: Sequence[Task], *, rollouts_per_task: int, max_steps: int,
                          gold_prob: float, seed: int, lockstep: bool = False) -> list[Episode]:
    """Trajectories of a scripted explorer: each step the next expert action with probability
    `gold_prob`, else a random admissible command. For runs whose policy cannot act yet (the
    embedded tiny default): the transitions are the env's real ones, and varied. Asynchronous
    (the default), each episode draws from its own generator (`ExplorerAgent.per_episode`), so
    the envs' answering order changes no draw; lock step keeps one generator, in index order."""
    flat = [t for t in tasks for _ in range(rollouts_per_task)]
    return run_episodes(ExplorerAgent(gold_prob=gold_prob, seed=seed, per_episode=not lockstep), envs, flat,
                        max_turns=max_steps, lockstep=lockstep)


# ----------------------------------------------------------------------------- the data set


@dataclasses.dataclass
class WorldModelData:
    train: list[Triple]  # what RL samples from (after the difficulty filter)
    heldout: list[Triple]  # evaluation: world-model accuracy
    stats: dict[str, float]


def _fits(chat, triple: Triple, cfg) -> bool:
    pcfg = prompt_config(cfg)
    return len(task_lib.prompt_ids(chat, triple, pcfg)) + cfg.rollout.max_new_tokens + 1 <= cfg.rollout.max_len


def answered_conversation(chat, triple, pcfg) -> Conversation:
    """A world-model prompt answered with the triple's `next_state`, the answer trained on
    (WM-SFT's example)."""
    conv = Conversation()
    conv.add_context(task_lib.prompt_ids(chat, triple, pcfg))
    target = task_lib.target_ids(chat, triple, pcfg)
    conv.ids += target
    conv.assistant_mask += [1] * len(target)
    conv.logprobs += [0.0] * len(target)
    return conv


def prompt_config(cfg) -> task_lib.PromptConfig:
    """The world-model prompt settings a run's config asks for (history, clipping, thinking)."""
    return task_lib.PromptConfig(history_window=cfg.rwml.history_window, max_chars=cfg.rwml.max_obs_chars,
                                 enable_thinking=cfg.rollout.enable_thinking)


def heldout_split(triples: Sequence[Triple], share: float, seed: int) -> tuple[list[Triple], list[Triple]]:
    """Held-out triples come from held-out tasks (no transition of theirs is trained on)."""
    tasks = sorted({(t.env, t.task_id) for t in triples})
    rng = np.random.default_rng(seed)
    k = max(1, int(round(share * len(tasks)))) if len(tasks) > 1 else 0
    held = {tasks[i] for i in rng.permutation(len(tasks))[:k]}
    return ([t for t in triples if (t.env, t.task_id) not in held],
            [t for t in triples if (t.env, t.task_id) in held])


def epoch_steps(triples: int, batch: int, epochs: float) -> int:
    """Steps that pass `epochs` times over `triples` training triples, `batch` a step."""
    return max(1, math.ceil(epochs * triples / batch))


def evaluation_sample(heldout: Sequence[Triple], n: int, seed: int) -> list[Triple]:
    """`n` held-out triples drawn without replacement across all held-out tasks (all of them
    when there are fewer), in a seeded order that stays fixed for the run."""
    order = np.random.default_rng(seed).permutation(len(heldout))[: min(n, len(heldout))]
    return [heldout[i] for i in sorted(order)]


def prepare_data(job: Job, params, reward_fn) -> WorldModelData:
    """Collects, splits and filters the triples once; later calls (a resumed run) read them
    back from out_dir/triples.jsonl so the data set never changes under a run."""
    cfg, w = job.cfg, job.cfg.rwml
    path = os.path.join(cfg.out_dir, DATA_FILE)
    if os.path.exists(path):
        triples, cols = triples_lib.load(path)
        train = [t for t, c in zip(triples, cols) if c["split"] == "train" and c["kept"]]
        heldout = [t for t, c in zip(triples, cols) if c["split"] == "heldout"]
        return WorldModelData(train, heldout, {"triples/train": float(len(train))})
    envs = make_envs(cfg, set(env_names(cfg.envs.train)))
    try:
        tasks = _collect_tasks(cfg)
        if w.collect_policy == "model":
            episodes = policy_trajectories(job, params, envs, tasks)
        else:  # "explore"
            episodes = explorer_trajectories(envs, tasks, rollouts_per_task=w.rollouts_per_task,
                                             max_steps=w.collect_max_turns, gold_prob=w.explore_gold_prob,
                                             seed=seeds.derive(cfg.seed, "explore"), lockstep=cfg.rollout.lockstep)
    finally:
        envs.close()
    failures = sum(e.failure is not None for e in episodes)
    raw = [t for e in episodes
           for t in triples_lib.from_trajectory(e.task.env, e.task.task_id, e.observations, e.actions,
                                                e.task.category)]
    unique = triples_lib.dedupe(raw)
    stats = {**triples_lib.statistics(raw, unique), "triples/infra_failures": float(failures)}
    # An empty next state (e.g. an episode's last step in some envs) can never be predicted
    # closely by the reward's measure: it would only ever be "hard". Dropped, and counted.
    stated = [t for t in unique if t.next_state.strip()]
    stats["triples/empty_next_state"] = float(len(unique) - len(stated))
    chat = Qwen3ChatRenderer(job.tokenizer)
    fitting = [t for t in stated if _fits(chat, t, cfg)]
    stats["triples/too_long"] = float(len(stated) - len(fitting))
    train, heldout = heldout_split(fitting, w.heldout_share, seeds.derive(cfg.seed, "heldout"))
    if not train or not heldout:
        raise ValueError(f"too few triples to train and evaluate on ({len(train)} train, {len(heldout)} held out): "
                         "collect more (rwml.collect_tasks / rollouts_per_task / collect_max_turns)")
    split = ["train"] * len(train) + ["heldout"] * len(heldout)
    kept, easy, mean_r = [True] * len(train), [False] * len(train), [float("nan")] * len(train)
    if w.filter.enabled and w.objective == "rl":
        kept, easy, mean_r, predictor_idx, fstats = difficulty_filter(job, params, train, reward_fn)
        for i in predictor_idx:
            split[i] = "predictor"
        stats.update(fstats)
    kept = list(kept) + [True] * len(heldout)
    easy = list(easy) + [False] * len(heldout)
    mean_r = list(mean_r) + [float("nan")] * len(heldout)
    os.makedirs(cfg.out_dir, exist_ok=True)
    triples_lib.save(path + ".tmp", train + heldout, split=split, kept=kept, easy=easy, mean_reward=mean_r)
    os.replace(path + ".tmp", path)  # atomic: a crash mid-write never leaves a partial data set
    kept_train = [t for t, s, k in zip(train, split, kept) if s == "train" and k]
    stats.update({"triples/train": float(len(kept_train)), "triples/heldout": float(len(heldout))})
    log.info("world-model data: %s", stats)
    return WorldModelData(kept_train, heldout, stats)


# ----------------------------------------------------------------------------- difficulty filter


def sft_on(job: Job, params, triples: Sequence[Triple], *, steps: int, batch_size: int, lr: float,
           seed: int, logger: MetricLogger | None = None, prefix: str = "sft"):
    """`steps` SFT steps on the real next states of `triples` (batches drawn with replacement
    after a shuffle); returns the new parameters (the input ones are left untouched). The
    difficulty filter's light predictor (a run's own SFT is the `WorldModelSFT` workload)."""
    opt = _sft_optimizer(job.cfg, lr)
    step_fn = make_sft_step(job.model_config, opt, num_micro_batches=job.cfg.rl.micro_batches, mesh=job.mesh)
    state = init_train_state(jax.tree.map(jnp.copy, params), opt.make())  # the step donates its state
    chat = Qwen3ChatRenderer(job.tokenizer)
    pcfg = prompt_config(job.cfg)
    rng = np.random.default_rng(seed)
    for s in range(steps):
        picked = [triples[i] for i in rng.integers(len(triples), size=batch_size)]
        state, m = sft_update(step_fn, job, state, [answered_conversation(chat, t, pcfg) for t in picked], prefix)
        if logger is not None:
            logger.log(s + 1, m)
    return state.params


def _sft_optimizer(cfg, lr: float) -> OptimizerConfig:
    """World-model SFT's optimizer: AdamW at `lr` without weight decay, the run's clipping."""
    return OptimizerConfig(lr=lr, weight_decay=0.0, grad_clip=cfg.rl.grad_clip)


def sample_answers(job: Job, params, triples: Sequence[Triple], *, samples: int, seed: int,
                   greedy: bool = False, first_row: int = 0) -> list[tuple[Conversation, str]]:
    """`samples` answers per triple (rows of one triple adjacent; row seeds keyed from
    `first_row`, so a process's share samples as those rows of the whole batch would)."""
    chat = Qwen3ChatRenderer(job.tokenizer)
    pcfg = prompt_config(job.cfg)
    prompts = [task_lib.prompt_ids(chat, t, pcfg) for t in triples for _ in range(samples)]
    sampler = job.eval_sampler if greedy else job.sampler
    return complete(params, sampler, job.tokenizer, prompts, max_new_tokens=job.cfg.rollout.max_new_tokens,
                    seed=seed, first_row=first_row)


def difficulty_filter(job: Job, params, triples: Sequence[Triple], reward_fn):
    """The paper's filter on the training triples: a predictor SFT'd on `sft_share` of them
    samples K answers for each of the rest; easy ones (mean reward >= tau_easy) stay with
    probability p_keep_easy. Returns (kept, easy, mean reward, predictor indices, stats); the
    predictor's own triples are not kept (they were trained on)."""
    f = job.cfg.rwml.filter
    fc = difficulty.FilterConfig(sft_share=f.sft_share, samples=f.samples, tau_d=f.tau_d, tau_easy=f.tau_easy,
                                 p_keep_easy=f.p_keep_easy)
    run_seed = job.cfg.seed
    pred_idx, rest_idx = difficulty.split_for_predictor(len(triples), fc.sft_share,
                                                        seeds.derive(run_seed, "filter_split"))
    predictor = sft_on(job, params, [triples[i] for i in pred_idx], steps=f.sft_steps, batch_size=f.sft_batch,
                       lr=f.sft_lr, seed=seeds.derive(run_seed, "filter_sft"))
    rest = [triples[i] for i in rest_idx]
    answers = sample_answers(job, predictor, rest, samples=fc.samples,
                             seed=seeds.derive(run_seed, "filter_samples"))
    targets = [t.next_state for t in rest for _ in range(fc.samples)]
    rewards = reward_fn([a for _, a in answers], targets, fc.tau_d)[0].reshape(len(rest), fc.samples)
    mean = rewards.mean(axis=1)
    keep_rest, easy_rest = difficulty.keep_mask(mean, fc.tau_easy, fc.p_keep_easy,
                                                seeds.derive(run_seed, "filter_keep"))
    kept, easy, mean_r = [False] * len(triples), [False] * len(triples), [float("nan")] * len(triples)
    for j, i in enumerate(rest_idx):
        kept[i], easy[i], mean_r[i] = bool(keep_rest[j]), bool(easy_rest[j]), float(mean[j])
    n_kept = int(keep_rest.sum())
    stats = {"filter/predictor_triples": float(len(pred_idx)), "filter/scored": float(len(rest)),
             "filter/easy_share": float(easy_rest.mean()) if len(rest) else 0.0,
             "filter/kept": float(n_kept),
             "filter/kept_hard_share": float((keep_rest & ~easy_rest).sum() / max(n_kept, 1)),
             "filter/mean_reward": float(mean.mean()) if len(rest) else 0.0}
    del predictor
    return kept, easy, mean_r, pred_idx, stats


# ----------------------------------------------------------------------------- rewards


def make_reward(job: Job):
    """`reward_fn(answers, targets, tau_d) -> (rewards, distances, counts)` from the config;
    `counts` are the embedding reward's chunking counts (`reward.CHUNK_COUNTS`; a judge has none)."""
    w = job.cfg.rwml
    if w.reward == "lines":  # templated states (rooms): exact lines, no embedder
        return line_reward.line_rewards_with_counts
    if w.reward in ("embedding", "embedding_facts"):
        embedder = make_embedder(w.embedder, w.embedder_path, mesh=job.mesh, batch_size=w.embedder_batch)
        score = (reward_lib.embedding_rewards_with_counts if w.reward == "embedding"
                 else reward_lib.embedding_facts_rewards_with_counts)
        return lambda answers, targets, tau_d: score(embedder, answers, targets, tau_d)
    judge = reward_lib.JudgeReward(_judge_chat(job), mode=w.reward.removeprefix("judge_"))

    def judged(answers, targets, tau_d):
        r = judge(answers, targets)
        return r, 1.0 - r, {}  # a judge has no distance; 1 - score keeps the metrics comparable
    return judged


def _judge_chat(job: Job):
    """A chat callable on a local judge model (rwml.judge_path: an HF dir), greedy."""
    from jaxscaffold.models import hf_io
    from jaxscaffold.models.tokenizer import load_tokenizer
    path = job.cfg.rwml.judge_path
    if not path:
        raise ValueError("an LLM-judge reward needs rwml.judge_path (a local HF chat model directory)")
    config, params = hf_io.load_pretrained(path, mesh=job.mesh, compute_dtype=job.cfg.model.compute_dtype)
    tokenizer = load_tokenizer(path)
    chat = Qwen3ChatRenderer(tokenizer)
    sampler = Sampler(config, batch_size=1, max_len=job.cfg.rollout.max_len, stop_ids=tokenizer.eos_ids,
                      options=SamplerOptions(sampling=GREEDY))

    def reply(messages):
        ids = chat.render(messages, add_generation_prompt=True, enable_thinking=False)
        return complete(params, sampler, tokenizer, [ids], max_new_tokens=16, seed=0)[0][1]
    return reply


# ----------------------------------------------------------------------------- the workload


def _task_of(t: Triple) -> Task:
    return Task(env="worldmodel", task_id=t.key()[:16], split="train", spec={"env": t.env}, category=t.category)


@register_workload("rwml")
class WorldModelWorkload:
    """What the trainer runs in RWML's stage 1: each step, `tasks_per_step` triples x `group_size`
    sampled answers, rewarded by the embedding distance (tau_d = rwml.tau_d); evaluation:
    greedy answers on the held-out triples."""

    def __init__(self, job: Job, params):
        self.reward_fn = make_reward(job)
        self.data = prepare_data(job, params, self.reward_fn)
        self.eval_triples = evaluation_sample(self.data.heldout, job.cfg.eval.tasks or len(self.data.heldout),
                                              seeds.derive(job.cfg.seed, "heldout", 1))  # eval.tasks 0: all
        self.stream = TaskStream(self.data.train, seed=seeds.derive(job.cfg.seed, "tasks"))
        self.chat = Qwen3ChatRenderer(job.tokenizer)
        self.reported = False
        self.epochs, self.batch = job.cfg.rwml.epochs, job.cfg.rollout.tasks_per_step
        self.export_dir = job.cfg.rwml.export_dir or os.path.join(job.cfg.out_dir, "hf")

    def collect(self, job: Job, params, step: int) -> tuple[list[Episode], dict]:
        """This process's share of the step's triples (all of them on one process), each with
        `group_size` sampled answers; metrics over every process's."""
        c, w = job.cfg.rollout, job.cfg.rwml
        everyone = self.stream.take(c.tasks_per_step)  # every process takes them: streams stay equal
        share = list(process_share(c.tasks_per_step))
        triples = [everyone[g] for g in share]
        answers = sample_answers(job, sampler_params(params, job.sampler), triples, samples=c.group_size,
                                 seed=seeds.derive(job.cfg.seed, "rollout", step),
                                 first_row=(share[0] if share else 0) * c.group_size)
        targets = [t.next_state for t in triples for _ in range(c.group_size)]
        rewards, distances, counts = self.reward_fn([a for _, a in answers], targets, w.tau_d)
        episodes = []
        for i, ((conv, _), r) in enumerate(zip(answers, rewards)):
            g = share[i // c.group_size]
            episodes.append(Episode(_task_of(everyone[g]), g, conv, reward=float(r), won=bool(r > 0),
                                    steps=1, done=True))
        distances = np.asarray([d for part in allgather_json([float(x) for x in distances]) for d in part])
        stats = {**rollout_metrics(episodes, "rollout", across_processes=True),
                 **_distance_metrics(distances, w.tau_d, "rollout"),
                 **_chunk_metrics(allgather_json(counts), "rollout")}
        if not self.reported:  # the data set's figures, once, in the first step's metrics
            stats.update(self.data.stats)
            self.reported = True
        return episodes, stats

    def evaluate(self, job: Job, params, step: int) -> dict[str, float]:
        """Greedy answers on the held-out triples (each process its share), metrics over all."""
        w = job.cfg.rwml
        everyone = self.eval_triples
        heldout = [everyone[i] for i in process_share(len(everyone))]
        answers = sample_answers(job, sampler_params(params, job.eval_sampler), heldout, samples=1,
                                 seed=seeds.derive(job.cfg.seed, "eval"), greedy=True)
        rewards, distances, counts = self.reward_fn([a for _, a in answers], [t.next_state for t in heldout],
                                                    w.tau_d)
        # One gather of every process's answers; accuracy per category too (tau2's domains:
        # `eval/success_worldmodel/retail`).
        mine = [[float(r), float(d), t.category] for t, r, d in zip(heldout, rewards, distances)]
        parts = allgather_json({"rows": mine, "counts": counts})
        rows = [row for part in parts for row in part["rows"]]
        summaries = [{"env": "worldmodel", "category": cat, "won": r > 0, "failed": False} for r, _, cat in rows]
        rewards = np.asarray([r for r, _, _ in rows])
        distances = np.asarray([d for _, d, _ in rows])
        return {"eval/success": float(rewards.mean()), **breakdown(summaries, "eval"),
                **_distance_metrics(distances, w.tau_d, "eval"),
                **_chunk_metrics([part["counts"] for part in parts], "eval")}

    def total_steps(self, configured: int) -> int:
        """`rwml.epochs` passes over the filtered training triples (`configured` when 0)."""
        return configured if self.epochs <= 0 else epoch_steps(len(self.data.train), self.batch, self.epochs)

    def hand_off_dir(self) -> str:
        """Where the trainer exports the final world model for stage 2 (`rwml.export_dir`)."""
        return self.export_dir

    def get_state(self) -> dict:
        return {"data": self.stream.get_state()}

    def set_state(self, state: dict) -> None:
        self.stream.set_state(state["data"])

    def close(self) -> None:
        pass


@register_workload("wm_sft")
class WorldModelSFT(WorldModelWorkload):
    """The WM-SFT baseline (`rwml.objective = "sft"`): no rollouts, no RL step. Each step
    `tasks_per_step` training triples (drawn with replacement, seeded once for the run) answered
    with their real next state, fitted with token-level cross-entropy (AdamW at `rl.lr`, no weight
    decay); evaluation and the hand-off export as RWML's."""

    def __init__(self, job: Job, params):
        super().__init__(job, params)
        single_process("the WM-SFT baseline")
        self.rng = np.random.default_rng(seeds.derive(job.cfg.seed, "sft"))
        self.pcfg = prompt_config(job.cfg)
        self.sft_step = make_sft_step(job.model_config, _sft_optimizer(job.cfg, job.cfg.rl.lr),
                                      num_micro_batches=job.cfg.rl.micro_batches, mesh=job.mesh)
        self.last_step = self.total_steps(job.cfg.steps)

    def collect(self, job: Job, params, step: int) -> tuple[list[Episode], dict]:
        """The step's triples as answered conversations; the data set's figures in the first
        and the last step's metrics."""
        train = self.data.train
        picked = [train[i] for i in self.rng.integers(len(train), size=self.batch)]
        episodes = [Episode(_task_of(t), g, answered_conversation(self.chat, t, self.pcfg), steps=1, done=True)
                    for g, t in enumerate(picked)]
        return episodes, dict(self.data.stats) if step in (1, self.last_step) else {}

    def train_on(self, job: Job, state, episodes: list[Episode]):
        state, metrics = sft_update(self.sft_step, job, state, [e.conversation for e in episodes])
        return state, {**metrics, "train/lr": job.cfg.rl.lr}  # constant: no warmup in this baseline

    def get_state(self) -> dict:
        return {"sft_rng": self.rng.bit_generator.state}

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["sft_rng"]


def _chunk_metrics(parts: list[dict[str, int]], prefix: str) -> dict[str, float]:
    """The embedding reward's chunking counts of every process (`parts`, gathered): texts read
    in several chunks, the most chunks of one text, texts cut anyway (never expected), and
    pairs whose chunk counts differ (scored wrong)."""
    out = {}
    for k in reward_lib.CHUNK_COUNTS:
        values = [p.get(k, 0) for p in parts]
        out[f"{prefix}/reward_{k}"] = float(max(values) if k == "max_chunks" else sum(values))
    return out


def _distance_metrics(distances: np.ndarray, tau_d: float, prefix: str) -> dict[str, float]:
    ok = distances < reward_lib.MAX_DISTANCE
    return {f"{prefix}/wm_accuracy": float(np.mean(distances < tau_d)),
            f"{prefix}/wm_mean_distance": float(np.mean(distances[ok])) if ok.any() else reward_lib.MAX_DISTANCE,
            f"{prefix}/wm_parsed": float(np.mean(ok))}
