"""COPE Explorer: predict which Mixture-of-Experts offloading policy is fastest on a model and
machine before building it.

The pipeline is trace -> profile -> replay -> estimate; the public entry points are
:func:`read_trace`, :func:`read_profile` and :func:`predict`.
"""
from .errors import CopeInputError
from .estimate.predict import predict, winner
from .geometry import CATALOG, ModelGeometry, get_model
from .matrix import CANDIDATE_IDS, CANDIDATES, Execution, Residency
from .parquet_io import (
                         read_measurements,
                         read_profile,
                         read_trace,
                         write_measurements,
                         write_profile,
                         write_trace,
)
from .version import __version__  # noqa: F401  (cope_core.__version__)

__all__ = ["CATALOG", "CANDIDATES", "CANDIDATE_IDS", "CopeInputError", "Execution",
           "ModelGeometry", "Residency", "get_model", "predict", "read_measurements",
           "read_profile", "read_trace", "winner", "write_measurements", "write_profile",
           "write_trace"]
