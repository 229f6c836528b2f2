"""Estimators (COPE schedules, atomic-op simulation, roofline) and the predict API."""
from .costs import ESTIMATORS, LayerCosts, layer_costs
from .predict import predict, predict_replay, winner

__all__ = ["ESTIMATORS", "LayerCosts", "layer_costs", "predict", "predict_replay", "winner"]
