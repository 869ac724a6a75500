"""tau2's user simulator for a run (`config.envs.tau2_user`), wherever tau2 runs: training
rollouts, RWML's triple collection and evaluation (`train.envs.make_envs`, which every one of
them, and `launch/eval.py`, builds its envs with).

Where the user model runs: with mode "model" in the trainer's own process, on its devices
(beside the policy), served by our sampler (`rollout.chat_server.ChatServer`) on a free
loopback port. Every env reaches it through the same HTTP client (`envs.chat_user`), whether it
runs in a pool worker process (which cannot share the trainer's device arrays) or in process
(`envs.num_workers=0`), so there is one path for both; concurrent user turns of a pool are
batched into the server's slots. On several hosts each process serves its own copy for its own
workers. Mode "endpoint" uses a server started elsewhere (`launch/serve_chat.py` on another
accelerator, or vLLM); mode "none" runs without a user, as the config asks explicitly.

    user, server = start_tau2_user(cfg.envs.tau2_user)   # server: None unless mode "model"
    ...  # Tau2Env(user=user)
    server.stop()
"""

from __future__ import annotations

import logging

from jaxscaffold.config import Tau2User
from jaxscaffold.envs.chat_user import ChatEndpointUser

log = logging.getLogger(__name__)

# The request a started server answers once before any env runs: it compiles the sampler's
# programs in the trainer's process (a first user turn inside a pool worker would otherwise
# wait for the compile, against envs.step_timeout_s) and fails the run at start if it cannot.
WARMUP = [{"role": "system", "content": "You are a customer talking to a support agent."},
          {"role": "user", "content": "Hi! How can I help you today?"}]


def serve(u: Tau2User):
    """A started ChatServer of the user model of `u` (mode "model"): its hf_path checkpoint,
    or a preset's random weights (seeded by `u.seed`) with the offline Qwen3 tokenizer."""
    from jaxscaffold.rollout.chat_server import ChatServer
    options = dict(max_len=u.max_len, slots=u.slots, enable_thinking=u.enable_thinking)
    if u.hf_path:  # weights in the compute dtype: the user model only samples (no f32 master copy)
        from jaxscaffold.models import hub

        server = ChatServer.from_pretrained(hub.resolve(u.hf_path, "envs.tau2_user.hf_path"),
                                            compute_dtype=u.compute_dtype, dtype=u.compute_dtype,
                                            model_name=u.hf_path, **options)
    else:
        server = ChatServer.from_preset(u.preset, seed=u.seed, compute_dtype=u.compute_dtype, **options)
    return server.start()


def client(u: Tau2User, base_url: str) -> ChatEndpointUser:
    """The user callable envs get: the endpoint at `base_url`, with `u`'s sampling settings."""
    return ChatEndpointUser(base_url, temperature=u.temperature, top_p=u.top_p, max_tokens=u.max_tokens,
                            timeout_s=u.timeout_s)


def describe(u: Tau2User) -> str:
    """The user simulator in a few words (the start-up summary's line)."""
    if u.mode == "none":
        return "none (envs.tau2_user.mode='none': no user)"
    sampling = f"temperature {u.temperature:g}, top_p {u.top_p:g}, {u.max_tokens} tokens a reply"
    if u.mode == "endpoint":
        return f"the endpoint {u.url}, {sampling}"
    model = f"{u.hf_path} (HF checkpoint)" if u.hf_path else f"preset {u.preset} (random weights)"
    return f"{model} served by our sampler in this process ({u.slots} slots), {sampling}"


def start_tau2_user(u: Tau2User):
    """(the user callable for `Tau2Env(user=...)`, None for mode "none"; the server this
    started, to stop when the envs close, or None)."""
    if u.mode == "none":
        log.info("tau2 runs without a user simulator (envs.tau2_user.mode='none')")
        return None, None
    if u.mode == "endpoint":
        return client(u, u.url), None
    server = serve(u)
    user = client(u, server.base_url)
    try:
        user(WARMUP)
    except Exception:
        server.stop()
        raise
    log.info("tau2 user simulator %s served on %s", u.hf_path or f"{u.preset} (random)", server.base_url)
    return user, server
