"""The `enhydra` command line."""
