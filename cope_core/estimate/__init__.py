"""Estimators (COPE schedules, atomic-op simulation, roofline) and the predict API."""
from .costs import ESTIMATORS, LayerCosts, layer_costs
from .predict import compose, predict, price, replay_counts, winner

__all__ = ["ESTIMATORS", "LayerCosts", "compose", "layer_costs", "predict", "price",
           "replay_counts", "winner"]
