"""RWML: reinforcement world-model learning (the model learns to predict the next state).

`triples` cuts trajectories into (history, action, next state) examples; `task` renders
them as prompts and parses the model's `<next_state>` answer; `reward` scores a prediction
by the embedding distance to the real next state (or an LLM judge); `difficulty` keeps the
informative triples. `jaxscaffold.train.workloads.world_model` wires them into training.
"""
