"""Export a chosen policy to the forms real runtimes take (the last stage of the pipeline). The
CLI and the app import this face only (an import-linter contract in pyproject.toml).

The app's Export page and ``cope export`` call the same two functions::

    policy = build_policy(trace, profile, calibration, experts_per_layer=16, candidate="best")
    out = render(policy, "llama.cpp")      # Rendered: text, extra files, exact or not

``policy_json`` / ``write_policy`` / ``read_policy`` keep the ``cope.policy/1`` record, from
which every format renders again without the Parquet inputs. The formats, one record each, are
:data:`EXPORT_FORMATS` (``formats.py``): a new format is one record there and its renderer.

* ``cope advise`` for a model on a machine named by its parts: :func:`advise` (``advise.py``),
  its records :class:`Advice`, :class:`RuntimeAnswer`, :class:`Speed` (``advice.py``) and what
  would help most (``upgrades.py``);
* llama.cpp's answer rendered (``llamacpp.py``): the sentence every surface leads with
  (:func:`lead_sentence`), the section ``cope predict`` closes with (:func:`cache_lines`) and a
  request's figures in words (:func:`request_line`); the answer itself is made once by
  :func:`cope_core.llamacpp.llamacpp_answer` and held by :attr:`Policy.llamacpp_answer`.
"""
from __future__ import annotations

from .advice import Advice, RuntimeAnswer, Speed
from .advising import RUNTIMES, advise
from .build import build_policy
from .common import Rendered
from .exllamav3 import DEFAULT_STATS
from .formats import EXPORT_FORMATS, FORMATS, ExportFormat, epilog, get_format, render
from .llamacpp import cache_lines, lead_sentence, request_line
from .policy import SCHEMA, Policy, policy_json, read_policy, write_policy
from .several import across_cards_file, machine_devices, profile_devices
from .sglang_kt import DEFAULT_PT

__all__ = ["DEFAULT_PT", "DEFAULT_STATS", "EXPORT_FORMATS", "FORMATS", "RUNTIMES", "SCHEMA",
           "Advice", "ExportFormat", "Policy", "Rendered", "RuntimeAnswer", "Speed",
           "across_cards_file", "advise", "build_policy", "cache_lines", "epilog", "get_format",
           "lead_sentence", "machine_devices", "policy_json", "profile_devices", "read_policy",
           "render", "request_line", "write_policy"]
