"""Deprecated location of the local broker: it moved to `enhydra.devtools` (broker.py).

Only `local` remains, re-exporting what `enhydra.spark.jars` imports from it.
"""
