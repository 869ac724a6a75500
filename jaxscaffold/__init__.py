"""jaxscaffold: RL for long-horizon LLM agents in JAX."""
