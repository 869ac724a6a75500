"""The FEE paper's four comparisons on the rooms testbed: its base, its measurements, the study grid."""
