"""Projections: read models built from the events topic, queryable like the aggregate's store."""

from enhydra.projections.model import Projection, fold_batch, replay_projection

__all__ = ["Projection", "fold_batch", "replay_projection"]
