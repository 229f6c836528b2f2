"""Export a chosen policy to the forms real runtimes take (the last stage of the pipeline).

The app's Export page and ``cope export`` call the same two functions::

    policy = build_policy(trace, profile, calibration, experts_per_layer=16, candidate="best")
    out = render(policy, "llama.cpp")      # Rendered: text, extra files, exact or not

``policy_json`` / ``write_policy`` / ``read_policy`` keep the ``cope.policy/1`` record, from
which every format renders again without the Parquet inputs. The formats, one record each, are
:data:`EXPORT_FORMATS` (``formats.py``): a new format is one record there and its renderer.
"""
from __future__ import annotations

from .build import build_policy
from .common import Rendered
from .exllamav3 import DEFAULT_STATS
from .formats import EXPORT_FORMATS, FORMATS, ExportFormat, get_format, render
from .policy import SCHEMA, Policy, policy_json, read_policy, write_policy
from .sglang_kt import DEFAULT_PT

__all__ = ["DEFAULT_PT", "DEFAULT_STATS", "EXPORT_FORMATS", "FORMATS", "SCHEMA", "ExportFormat",
           "Policy", "Rendered", "build_policy", "get_format", "policy_json", "read_policy",
           "render", "write_policy"]
