"""What a training step collects and how the model is evaluated, behind one protocol
(`base.Workload`): task RL on environments (`env_rl`) and RWML's world-model RL (`world_model`)."""
