"""Profiles: measured or analytic operator and schedule costs per operating point."""
from .data import OperatingPoint, Profile

__all__ = ["OperatingPoint", "Profile"]
