"""Defaults shared by every config; each experiment file overrides what it changes."""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.job = "rl"  # rl (task RL on environments: FEE, the baseline, RWML's stage 2) | rwml (world-model RL, configs/rwml.py)
    c.seed = 0  # run seed: task order, sampling keys, feedback decisions (restart-safe)
    c.out_dir = "runs/default"  # logs (tensorboard, metrics.jsonl), checkpoints, curves.png
    c.steps = 200  # training steps (one rollout batch + its optimizer steps each)

    c.model = ConfigDict()
    c.model.hf_path = ""  # HF checkpoint: a local directory or a hub id (Qwen/Qwen3-4B: from the hub cache, downloaded there unless HF_HUB_OFFLINE); empty: random init of `preset`
    c.model.preset = "qwen3-4b"  # jaxscaffold.models.config preset name, or "tiny"
    c.model.tokenizer = ""  # HF tokenizer: a directory or a hub id; empty: hf_path's, else the offline Qwen3 one
    c.model.vocabulary = ""  # word-level testbed vocabulary (rooms): its WordTokenizer, and a preset's embedding resized to it; empty: the tokenizer above
    c.model.param_dtype = "float32"  # master weights
    c.model.compute_dtype = "bfloat16"  # matmuls (accumulated in f32)
    c.model.cache_dtype = "bfloat16"  # sampler KV cache
    c.model.scan_layers = True  # lax.scan over layers (compile time flat in depth)
    c.model.remat_policy = "full"  # none | full | save_dots: activation memory vs recompute

    c.mesh = ConfigDict()
    c.mesh.data = -1  # pure data parallelism (-1: all remaining devices)
    c.mesh.fsdp = 1  # data parallel with sharded parameters and optimizer state
    c.mesh.tensor = 1  # tensor parallelism over heads / MLP / vocab
    c.mesh.devices = 0  # the first n devices only (0: all); one process only, e.g. to leave some free
    c.mesh.rollout_devices = 0  # split the pod: the last n of the devices above sample (rollouts, evaluation), the others train; weights copied device to device after each update; one process only, pair with rollout.max_staleness >= 1 (0: every device does both, in turn)

    c.rl = ConfigDict()
    c.rl.algorithm = "grpo"  # grpo | dapo | gspo | drgrpo (jaxscaffold.rl.presets)
    c.rl.lr = 1e-6  # AdamW learning rate (constant after warmup)
    c.rl.weight_decay = 0.01  # AdamW decoupled weight decay
    c.rl.grad_clip = 1.0  # global-norm gradient clipping
    c.rl.warmup_steps = 0  # linear warmup of the learning rate
    c.rl.ppo_epochs = 1  # passes over each rollout batch
    c.rl.num_minibatches = 1  # optimizer steps per epoch (1: the whole batch; rl.minibatch_rows sets them by rows, as the reference)
    c.rl.micro_batches = 1  # gradient-accumulation micro-batches per optimizer step
    c.rl.kl_coef = 0.0  # KL-to-reference loss weight (0: off, as the reference)
    c.rl.entropy_coef = 0.0  # entropy bonus weight
    c.rl.minibatch_rows = 0  # rows per optimizer step: ceil(rows / this) near-equal mini-batches (the reference: 128 step rows); 0: rl.num_minibatches
    c.rl.recompute_old_logprobs = False  # True: the trainer recomputes the old log-probs before the updates (the reference, verl); False: the sampler's
    c.rl.tis_cap = 0.0  # truncated importance sampling: token loss x min(pi_trainer_old / pi_sampler, cap), e.g. 2 (Yao et al.); 0: off (needs recompute_old_logprobs)
    c.rl.mis = "off"  # masked importance sampling: off | token | sequence: mask tokens (or whole rows, geometric-mean ratio) whose ratio pi / pi_sampler leaves [mis_lo, mis_hi]
    c.rl.mis_lo = 0.5  # MIS: the lowest ratio kept
    c.rl.mis_hi = 2.0  # MIS: the highest ratio kept
    c.rl.mis_denominator = "all"  # MIS: all (a masked token still counts in the aggregation's denominators: the step shrinks with what is masked) | kept (verl: masked tokens leave the counts; needs rl.recompute_old_logprobs)
    c.rl.dynamic_sampling_exhausted = "continue"  # DAPO after max_num_gen_batches: continue (train on the groups collected, as the reference) | raise
    c.rl.overlong_buffer = 0  # DAPO's overlong length penalty over the last this-many tokens of a turn's budget (DAPO paper: e.g. 512); 0: off, as the reference's DAPO
    c.rl.group_stats = "trajectory"  # step-wise rows: a group's mean/std counts each trajectory once ("trajectory") or every step row ("row": verl-agent, the reference)
    c.rl.max_bad_steps = 3  # consecutive steps whose update was skipped (non-finite loss or gradient) before the run stops (exit 1)
    c.rl.max_empty_steps = 3  # consecutive steps where every episode failed or no row reached the loss before the run stops (exit 1)

    c.rollout = ConfigDict()
    c.rollout.tasks_per_step = 16  # distinct tasks (GRPO groups) per training step
    c.rollout.group_size = 8  # rollouts per task
    c.rollout.max_turns = 15  # environment steps per episode in training
    c.rollout.max_new_tokens = 512  # tokens per model turn
    c.rollout.max_len = 8192  # context (KV-cache slots) per episode
    c.rollout.temperature = 1.0  # sampling temperature in training
    c.rollout.top_p = 1.0  # nucleus sampling in training
    c.rollout.enable_thinking = True  # Qwen3 thinking mode in the generation prompt
    c.rollout.representation = "trajectory"  # trajectory (one token sequence per episode) | stepwise (the reference code's rows)
    c.rollout.history_window = 2  # stepwise: (observation, action) steps shown in each rebuilt prompt
    c.rollout.sampler_devices = 0  # devices a host samples on, tensor parallel (0: all of its devices of the training mesh; 1: one device, unsharded on one process)
    c.rollout.max_staleness = 0  # k > 0: a background collector samples up to k steps ahead of training (step t with the policy after step t - 1 - k); rows more than k versions old are dropped (0: on-policy, collect then train)
    c.rollout.partial = False  # with max_staleness >= 1: episodes running when the trainer publishes a newer policy continue under it from the next decode chunk (each token keeps the version that sampled it; the KV cache of earlier tokens is kept); False: an episode is sampled by one version
    c.rollout.max_rows_in_flight = 0  # sampler rows at once: the step's groups in waves of whole groups (0: all at once; a memory knob, the KV cache scales with it)
    c.rollout.lockstep = False  # True: all episodes step together turn by turn (the reference); False: each episode advances on its own
    c.rollout.decode_chunk = 16  # asynchronous rollouts: tokens each ready row decodes before observations and new episodes join

    c.envs = ConfigDict()
    c.envs.train = "sciworld,bfcl"  # comma-separated env names (jaxscaffold.envs.registry), env:split allowed
    c.envs.train_split = "train"  # catalogue split to train on
    c.envs.eval = "sciworld::128,bfcl:validation"  # evaluated envs (standard env, greedy); env:split:n overrides; as the reference: 128 ScienceWorld, all 400 BFCL validation entries
    c.envs.eval_split = "test"  # held-out split
    c.envs.num_workers = 4  # environment worker processes (0: in this process)
    c.envs.step_timeout_s = 60.0  # a worker silent this long is restarted; its episodes fail
    c.envs.reset_timeout_s = 180.0  # the same for resets (the first ones start JVMs)
    c.envs.env_kwargs = ""  # JSON {env: {constructor kwarg: value}}, e.g. '{"tau2": {"max_steps": 30}}' (tau2's user: envs.tau2_user)
    # tau2's user simulator (jaxscaffold.train.user_model): a run with tau2 needs one or mode "none".
    # mode "model": our sampler serves the model in the trainer's process, on its devices, behind a
    # loopback chat endpoint that pool workers and in-process envs alike call (one per process).
    c.envs.tau2_user = ConfigDict()
    c.envs.tau2_user.mode = "model"  # model (served by our sampler: hf_path or preset) | endpoint (url, e.g. launch/serve_chat.py) | none (no user: explicit)
    c.envs.tau2_user.hf_path = ""  # mode model: an HF chat model (with its tokenizer), a local directory or a hub id
    c.envs.tau2_user.preset = ""  # mode model: instead, random weights of a preset ("tiny": tests) with the offline Qwen3 tokenizer
    c.envs.tau2_user.url = ""  # mode endpoint: an OpenAI-compatible base URL, e.g. http://127.0.0.1:8011/v1
    c.envs.tau2_user.temperature = 0.0  # the user's sampling temperature (tau2's default: 0.0; 0 is greedy)
    c.envs.tau2_user.top_p = 1.0  # the user's nucleus sampling
    c.envs.tau2_user.max_tokens = 1024  # tokens per user reply
    c.envs.tau2_user.max_len = 8192  # mode model: prompt + reply tokens of one user request, at most
    c.envs.tau2_user.slots = 8  # mode model: user requests generated together, at most
    c.envs.tau2_user.compute_dtype = "bfloat16"  # mode model: the user model's compute dtype
    c.envs.tau2_user.enable_thinking = False  # mode model: let the user model reason before replying (reasoning is dropped)
    c.envs.tau2_user.timeout_s = 120.0  # seconds an env waits for one user reply (a pool worker is also cut at envs.step_timeout_s: raise it for slow user models)
    c.envs.tau2_user.seed = 0  # mode model with a preset: the random weights' seed

    c.feedback = ConfigDict()
    c.feedback.schedule = "ag_early_oe_late"  # jaxscaffold.feedback.schedule.make name; "none" = standard; "bandit" = learned (bandit_* below)
    c.feedback.probability = 0.5  # chance a group gets the active feedback
    c.feedback.mode = "group"  # group | rollout | first_half | even (randomisation)
    c.feedback.switch_step = 100  # training step where AG hands over to OE
    c.feedback.ag_form = "paper"  # paper (next gold action) | reference (first 3 gold + [Caution!])
    c.feedback.oe_form = "checklist"  # checklist ([Pass]/[Pending], [k/n done]) | reference (raw progress)
    c.feedback.bandit_arms = "none,ag_early,ag_late,oe_early,oe_late"  # schedules a "bandit" schedule picks one of per training step
    c.feedback.bandit_signal = "informative"  # arm reward: informative (share of groups with unequal rewards) | success (mean success)
    c.feedback.bandit_discount = 0.95  # per-step decay of the arms' Beta posteriors to the prior (follows a drifting best arm)
    c.feedback.bandit_prior = 1.0  # every arm starts at Beta(prior, prior)

    c.eval = ConfigDict()
    c.eval.every = 5  # evaluate every N training steps (0: never)
    c.eval.tasks = 0  # held-out tasks per evaluated env at most (its envs.eval n, else its whole split; 0: no cap), balanced over its categories, group 1
    c.eval.max_turns = 30  # environment steps per evaluation episode
    c.eval.max_len = 0  # context (KV-cache slots) per evaluation episode (0: rollout.max_len)
    c.eval.at_start = True  # also evaluate before the first training step (step 0 of a fresh run), as the reference; needs eval.every > 0
    c.eval.batch_size = 0  # evaluation sampler rows per process (0: the smaller of eval.tasks and the training rollout rows; those rows when eval.tasks is 0)

    c.checkpoint = ConfigDict()
    c.checkpoint.every = 10  # save every N steps (and at the end)
    c.checkpoint.keep = 3  # checkpoints kept
    c.checkpoint.allow_change = ""  # comma-separated fields a resume may change (e.g. "rl.lr"); other changes are refused
    # Params-only checkpoints and the end-of-run HF export (export and eval read either kind of checkpoint).
    c.checkpoint.params_only_every = 0  # also save the parameters alone (no optimizer state: 1/3 the size) every N steps to out_dir/params (0: never); a resume cannot start from one
    c.checkpoint.params_only_keep = 0  # params-only checkpoints kept (0: all)
    c.export = ConfigDict()
    c.export.at_end = False  # after the last step, write the final parameters (LoRA: merged) as an HF directory, as launch/export_hf.py does
    c.export.dir = ""  # that directory (empty: out_dir/hf)
    c.export.dtype = ""  # its tensors' dtype: float32 | bfloat16 | float16 (empty: model.param_dtype)
    c.export.verify = False  # also reload it with transformers and compare logits (holds the model twice in host memory: off at scale)

    c.lora = ConfigDict()
    c.lora.rank = 0  # LoRA adapter rank (0: off, full fine-tuning); on: only the adapters train and are checkpointed
    c.lora.alpha = 16.0  # LoRA scale numerator: W' = W + alpha / rank * A @ B (as PEFT, not rsLoRA)
    c.lora.targets = "q,k,v,o,gate,up,down"  # adapted projections, comma-separated among q,k,v,o,gate,up,down
    c.lora.base_dtype = "bfloat16"  # the frozen base weights' dtype (the adapters and their moments: model.param_dtype)

    c.logging = ConfigDict()
    c.logging.verbose = False  # also third-party INFO logs (Orbax, absl, JAX); off: their warnings and errors only
    c.logging.wandb = "off"  # off | offline (files in out_dir/wandb, `wandb sync` uploads them) | online (needs wandb)
    c.logging.wandb_project = "jaxscaffold"  # wandb project of the run (the run is named after out_dir)

    c.memory = ConfigDict()
    c.memory.check_at_start = True  # compile the memory plan (launch/plan.py's) at start; refuse a run that cannot fit
    c.memory.hbm_gb = 0.0  # memory per device to check against, GB; 0: the device's own limit (none on CPU: no check)
    return c
