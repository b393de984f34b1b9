"""Changelog-backed RocksDB store partitions and their restore."""
