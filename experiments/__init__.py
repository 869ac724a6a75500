"""Research on top of the package: each folder is one study or analysis (its scripts, configs,
expectations and observations). Nothing in `jaxscaffold/` imports from here."""
