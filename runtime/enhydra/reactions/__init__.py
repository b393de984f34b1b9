"""Reactions: commands for this service (or another) made from another service's events."""

from enhydra.reactions.model import Emit, Reaction, Upstream, react_batch

__all__ = ["Emit", "Reaction", "Upstream", "react_batch"]
