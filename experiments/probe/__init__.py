"""The FEE paper's internalisation probe on BFCL file-system outputs."""
