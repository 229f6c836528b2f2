"""The sentences an export's answer leads with, above its command (``ExportFormat.lead``)."""
from __future__ import annotations

from ..llamacpp import baseline_of
from .policy import Policy


def lead_line(policy: Policy) -> str | None:
    """llama.cpp's default (``--fit``) against its best configuration, the sentence every
    llama.cpp answer leads with (None: the policy has no llama.cpp record, or no VRAM budget to
    fit); the same sentence as ``cope_core.app.llamacpp_view.default_line`` of the record."""
    base = baseline_of(policy.llamacpp_cache)
    return None if base is None else base.lines()[0] + "."
