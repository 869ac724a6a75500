"""RL core on arrays only: advantages, PPO / GSPO losses, algorithm presets, DAPO helpers."""
