"""RWML: reinforcement world-model learning (the model learns to predict the next state).

`triples` cuts trajectories into (history, action, next state) examples; `task` renders
them as prompts and parses the model's `<next_state>` answer; `reward` scores a prediction
by the embedding distance to the real next state (or an LLM judge), reading long states
whole: `chunking` cuts a text past the embedder's token limit (`embedders`) into chunks it
reads entirely; `difficulty` keeps the informative triples. (tau_d per embedder and how far
training moved the weights: experiments/calibration/ and experiments/weight_change/.)
`jaxscaffold.train.workloads.world_model` wires them into training.
"""
