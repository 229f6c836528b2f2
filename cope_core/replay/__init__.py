"""Cache replay: hit histograms and prefetch counts of every residency over a routing trace."""
from .engine import ReplayCounts, replay

__all__ = ["ReplayCounts", "replay"]
