"""The training job: configs, checkpoints, logging and the loop that wires everything."""
