"""Reading and writing the project's Parquet files: traces, profiles and measurements.

docs/formats.md documents every column, metadata key and check. This package is the only code
that touches Parquet, so every malformed file fails the same way: one
:class:`~cope_core.errors.CopeInputError` line naming the file, the field, the first offending
row (0-based) and value, and what was expected. Writers run the same checks as readers, so a
file this package wrote always reads back. Modules: :mod:`._common` (opening, metadata, typed
columns, the atomic write), :mod:`.trace`, :mod:`.profile`, :mod:`.measurements`.
"""
from ..errors import CopeInputError
from ..measurements import Measurements
from ..profile.data import COLUMNS as PROFILE_COLUMNS
from ._common import (
                      MEASUREMENTS_SCHEMA,
                      META_KEY,
                      PROFILE_SCHEMA,
                      PROFILE_SCHEMAS,
                      SCHEMAS,
                      TRACE_SCHEMA,
                      decoded_bytes,
                      detect_schema,
                      read_metadata,
                      schema_family,
)
from .measurements import MEASUREMENT_COLUMNS, read_measurements, write_measurements
from .profile import read_profile, write_profile
from .trace import TRACE_COLUMNS, read_trace, trace_prompts, write_trace, write_trace_parts

__all__ = ["CopeInputError", "MEASUREMENTS_SCHEMA", "MEASUREMENT_COLUMNS", "META_KEY",
           "Measurements", "PROFILE_COLUMNS", "PROFILE_SCHEMA", "PROFILE_SCHEMAS", "SCHEMAS",
           "TRACE_COLUMNS", "TRACE_SCHEMA", "decoded_bytes", "detect_schema", "read_measurements",
           "read_metadata", "read_profile", "read_trace", "schema_family", "trace_prompts",
           "write_measurements", "write_profile", "write_trace", "write_trace_parts"]
