"""RWML vs WM-SFT vs policy RL alone on the rooms testbed: its base, the study grid."""
