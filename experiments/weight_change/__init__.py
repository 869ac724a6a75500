"""How far training moved a model's weights, layer by layer (the RWML paper's RWML-vs-SFT evidence)."""
