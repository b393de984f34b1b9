"""Who runs which task: a pure assignor (KIP-441/KIP-708 semantics) and its Kafka adapter."""

from enhydra.assignment.assignor import (
    Assignment,
    AssignmentConfig,
    ClientAssignment,
    ClientState,
    assign,
)

__all__ = ["Assignment", "AssignmentConfig", "ClientAssignment", "ClientState", "assign"]
