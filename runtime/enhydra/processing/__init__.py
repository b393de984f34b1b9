"""Decide/apply processing: the pure batch core and the Kafka engine around it."""
