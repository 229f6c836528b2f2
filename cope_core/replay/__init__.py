"""Cache replay: hit histograms and prefetch counts of every residency over a routing trace."""
from .engine import ReplayCounts, fill_order, popularity, replay

__all__ = ["ReplayCounts", "fill_order", "popularity", "replay"]
