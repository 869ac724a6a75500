"""The embedded default: the whole loop on CPU in minutes with a tiny random Qwen3 on the
real Qwen3 vocabulary. It trains on the `letters` task (reward: the share of the answer's
letters that are the asked one; random text scores ~0.12) and evaluates greedily on 8 held-out
letters tasks at step 0 (before training) and every 10 steps, at the env's own success bar (a
share of at least 0.5). The last line shows each from its first evaluation to its last.

What it does (measured, 2-core CPU): the train reward stays near random text's ~0.12 for 10
to 20 steps, then rises as the policy settles on one answer (entropy 11.9 -> 0); the greedy
eval share goes 0.0 (step 0: the random model writes no letters) -> the share of the answer it
settled on. The letters catalogue asks for 'e' in every task, so the 8 greedy eval answers are
alike and success is 0 or 1. Once the policy's samples are alike GRPO has no advantage left,
so a run keeps the answer it settled on, and which answer that is depends on the seed.

The 32 rollouts of a step form one GRPO group (1 task x 32): the tasks' prompts are all the
same, and four groups of 8 (the former 4 x 8) gave four noisier baselines of the same samples.
It samples and trains the same 32 rows a step, so a step costs the same (seed 2 side by side
under the same load: 879 s for 1 x 32, 883 s for 4 x 8 at temperature 1.5). Eval share at
step 30 (success needs 0.5), by seed:

    seed             0      1      2      3
    4 x 8 (former)  1.00   0.29   0.40   0.33
    1 x 32          0.50   0.38   0.50   0.50

So seeds 0, 2 and 3 reach eval success 1, at the bar (0.50, where seed 0 made 1.00 with 4 x
8), and seed 1 still fails: one group narrows more slowly and keeps improving while it does
(seed 2's train reward: 0.31 -> 0.50 over steps 26-30), and seed 1 was still narrowing at step
30 (entropy 0.7, train reward 0.31 -> 0.35 over steps 26-30). Which answer a run settles on
is still the seed's luck: no recipe measured reliably reaches 1.00 within 30 steps.

Tried with 4 x 8 and not kept: lr 1e-2 (entropy still 11.88 at step 12: too slow for 30 steps),
sampling temperature 1.5 (seed 2: 0.33), Adam's epsilon at 1e-3, not 1e-8 (a change in the
code, not kept: seed 1: 0.67, seed 2: 0.33), an entropy bonus rl.entropy_coef=0.01 and 4-token
answers (seed 1: 0.33, 0.29), and 16-token answers (seed 0: 0.27). The learning rate stays high
(3e-2) for speed: seed 0 of the former recipe learned in ~330 s on a quiet machine; the runs
above took 830-990 s each, two at a time on a machine shared with other jobs.

The real environments run end to end with a random model too, but score 0 there (it cannot
solve them), which read as failure beside the letters score; to watch them run, add
`--config.envs.eval=letters:test:8,sciworld:test:2,bfcl:validation:2 --config.eval.max_len=4096`
(BFCL's system prompt holds the function docs, up to ~3.7k tokens; each is reported as its own
`eval/success_ENV`). They are not trained on: their prompts (~300-500 tokens for ScienceWorld,
~2.5-3.7k for BFCL) would make a step that holds one about 8x to 64x dearer than a letters step.

Checkpoints: one is kept (`checkpoint.keep = 1`): the run's out_dir is 104 MB (measured), where
three made 311 MB. A full checkpoint holds the parameters and Adam's two moments in f32, 3 x 39
MB nominal (the 151,936 x 64 embedding is most of the 9.8M parameters); a params-only one would
be a third of that, but a run cannot resume from it, and resuming an interrupted demo is what
the checkpoint is for; bf16 parameters would halve it, but the configs it demonstrates train
f32 master weights."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import base  # noqa: E402


def get_config():
    c = base.get_config()
    c.out_dir = "runs/tiny"
    c.steps = 30
    c.model.preset = "tiny"  # 2 layers, hidden 64, Qwen3 vocabulary (about 10M parameters)
    c.model.compute_dtype = "float32"
    c.model.cache_dtype = "float32"
    c.model.remat_policy = "none"
    c.rl.lr = 3e-2  # a random tiny model on a one-step task: learns in tens of steps
    c.rollout.tasks_per_step = 1  # every letters task asks for 'e' (one prompt): one group of 32 gives one baseline of 32 samples, not four noisier ones of 8
    c.rollout.group_size = 32  # the same 32 rows a step as 4 x 8, so the same cost; more seeds settle at the bar (see above)
    c.rollout.max_turns = 1
    c.rollout.max_new_tokens = 8  # short answers: a cheaper step (with 4 x 8, seed 0 reached a share of 1.0; with 16 tokens 0.27)
    c.rollout.max_len = 128
    c.rollout.enable_thinking = False
    c.envs.train = "letters"
    c.envs.eval = "letters:test:8"  # env:split:n tasks: the task it trains, held out
    c.envs.num_workers = 0  # in this process: a worker's episodes arrive in uneven waves, and each new row count compiles (measured: +18-20 s at step 2, in one run also at step 4)
    c.feedback.schedule = "none"
    c.eval.every = 10  # evaluations at 0, 10, 20 and 30: the rise (measured: about step 20) shows
    c.eval.tasks = 0  # no cap: the counts of envs.eval
    c.eval.batch_size = 2  # eval rows (a BFCL prompt's prefill, when evaluated, costs ~5 s a row on CPU)
    c.eval.max_turns = 1
    c.checkpoint.every = 10
    c.checkpoint.keep = 1  # a full checkpoint is 104 MB here (see above)
    return c
