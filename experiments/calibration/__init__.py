"""How far apart an embedder puts true and near-miss next states: tau_d per world-model reward."""
