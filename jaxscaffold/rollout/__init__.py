"""Rollouts: a KV-cache sampler for multi-turn, token-in-token-out generation."""
