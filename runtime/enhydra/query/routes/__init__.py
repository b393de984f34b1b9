"""The HTTP routes of an instance, one module per family; each exposes `routes(ctx)`.

keys.py        a key's state from any instance (forwarded to the owner), projections too
scans.py       scans and counts over every partition (fanned out to the owners)
metadata.py    who hosts what: metadata, a key's placement, this instance's stats
operations.py  health, metrics, the OpenAPI document, the status page
admin.py       shutdown, rebalance and the admin endpoints other parts add
"""
