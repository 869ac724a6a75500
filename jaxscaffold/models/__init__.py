"""Qwen3 in JAX: config, model, sharding, HF checkpoint I/O, tokenizer and chat format."""
