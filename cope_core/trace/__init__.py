"""Routing traces: the in-memory record and the synthetic generator."""
from .data import Trace

__all__ = ["Trace"]
