"""Queries over the stores: HTTP API and, later, routing across instances."""
