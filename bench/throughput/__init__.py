"""Throughput benchmark: the Enhydra ledger against the Python ceiling, faust and Quix Streams.

Every system reads the same preloaded commands topic on the same fresh broker, one after the
other, and is measured from the outside (output record timestamps, /proc of its process), so no
system reports its own numbers. Run it with `python -m bench.throughput` or, with the other
benchmarks, `python -m bench`.
"""
