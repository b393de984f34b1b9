"""Queries over the stores: metadata, key routing, scans, the HTTP API, the status page."""

from enhydra.query.client import Client, QueryError

__all__ = ["Client", "QueryError"]
