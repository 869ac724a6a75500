"""Memory plan of a run: what each device holds, before anything is allocated.

  python launch/plan.py --config fee.py [--config.FIELD=VALUE ...] --hbm-gb 16 --devices 8 [--json]
  python launch/plan.py --config fee.py --target v5e-8 --search
  python launch/plan.py --config fee_async.py --devices 16 --hosts 4   # a pod of 4 hosts x 4 devices
  python launch/plan.py --config fee_async.py --devices 32 --hosts 4 --config.mesh.rollout_devices=8

Per device: parameters, optimizer state, gradients, activations (XLA's memory analysis of the
train step compiled for the run's largest batch, under its remat policy), the sampler's weights
and KV cache; the peak of the train and rollout phases against the device's memory, and what to
change when it does not fit. `--hosts P`: the devices are P hosts' (each samples its share of
the groups on its own devices, and with rollout.max_staleness = k holds the collector's k + 1
versions in the samplers' layout). Without an accelerator the mesh is made of fake CPU devices
(`--devices`), so the activation figure is XLA:CPU's estimate of the accelerator's.
`--search` doubles rl.micro_batches (recompiling) until the train phase fits, and says why it
stopped: the number that fits, or that one row per device a micro-batch still does not. Exit code 0 when the plan fits, 1 when it does not, 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# name: (devices, memory per device in GB): chips as Cloud TPU and NVIDIA list them.
TARGETS = {"v5e-8": (8, 16), "v5p-8": (4, 95), "v6e-8": (8, 32), "h200": (1, 141)}
PLATFORMS = {"v5e-8": "tpu", "v5p-8": "tpu", "v6e-8": "tpu", "h200": "gpu"}  # whose backend picks the kernels


def main(argv: list[str]) -> int:
    from jaxscaffold import config as config_lib
    try:
        cfg, rest, show_help = config_lib.from_command_line(argv, os.path.join(ROOT, "configs"))
        if cfg is not None:
            from jaxscaffold.train.config_checks import check
            check(cfg)
    except config_lib.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=sorted(TARGETS), help="a slice: sets --devices and --hbm-gb")
    p.add_argument("--devices", type=int, default=8, help="devices of the mesh (fake CPU ones without an accelerator)")
    p.add_argument("--hbm-gb", type=float, default=16.0, help="memory per device, GB")
    p.add_argument("--hosts", type=int, default=1, help="processes (hosts) the devices belong to, as many each: "
                   "each samples its share of the groups; a split pod (mesh.rollout_devices) samples on the last of each")
    p.add_argument("--platform", choices=("tpu", "gpu", "portable"), default=None,
                   help="whose attention kernel the plan counts (default: the target's, else portable)")
    p.add_argument("--search", action="store_true", help="double rl.micro_batches until the train phase fits")
    p.add_argument("--json", action="store_true", help="one JSON object")
    if show_help:
        p.print_help()
        return 0
    args = p.parse_args(rest)
    if cfg is None:
        print("error: --config is required (a name in configs/ or a path)", file=sys.stderr)
        return 2
    devices, hbm_gb = TARGETS[args.target] if args.target else (args.devices, args.hbm_gb)
    platform = args.platform or PLATFORMS.get(args.target, "portable")
    if not os.environ.get("JAX_PLATFORMS") or os.environ["JAX_PLATFORMS"] == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={devices}")
    import jax
    from jaxscaffold.train import memory_plan
    if jax.device_count() < devices:
        print(f"error: {devices} devices asked, {jax.device_count()} present", file=sys.stderr)
        return 2
    try:
        result = memory_plan.plan(cfg, hbm_bytes=hbm_gb * 1e9, devices=jax.devices()[:devices], platform=platform,
                                  hosts=args.hosts)
        searched = None  # why --search stopped
        while args.search:
            if result.train_peak <= result.hbm_bytes:
                searched = f"the train phase fits with rl.micro_batches={cfg.rl.micro_batches}"
                break
            mb = cfg.rl.micro_batches * 2
            data_parallel = (devices - cfg.mesh.rollout_devices) // max(1, cfg.mesh.tensor)  # the training devices
            rows = memory_plan.worst_case_batch(cfg)[0]
            if mb * data_parallel > rows:  # past one row per device a micro-batch: only padding rows would be added
                searched = (f"the train phase does not fit even at rl.micro_batches={cfg.rl.micro_batches}, one row "
                            f"per device ({rows} rows over {data_parallel} data-parallel devices); more micro-batches "
                            "would add only padding rows: see the advice")
                break
            cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, micro_batches=mb))
            result = memory_plan.plan(cfg, hbm_bytes=hbm_gb * 1e9, devices=jax.devices()[:devices], platform=platform,
                                      hosts=args.hosts)
    except (ValueError, OSError) as e:  # a mesh that does not divide the devices, a missing checkpoint
        print(f"error: {e}", file=sys.stderr)
        return 2
    advice = result.advice(cfg)
    if args.json:
        print(json.dumps({**result.to_dict(), "micro_batches": cfg.rl.micro_batches, "advice": advice,
                          **({"search": searched} if searched else {})}))
    else:
        where = (args.target or f"{devices} devices") + (f" on {args.hosts} hosts" if args.hosts > 1 else "")
        print(f"memory plan per device, {where} of {hbm_gb:g} GB (rl.micro_batches={cfg.rl.micro_batches}):")
        print(result.table())
        for note in result.notes:
            print(f"note: {note}")
        for line in advice:
            print(f"- {line}")
        if searched:
            print(f"search stopped: {searched}")
    return 0 if result.fits() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
