"""The Export page's pure logic: the order of its tabs, the command each leads with, and the
uploaded model file's name in place of the renderers' ``MODEL.gguf``."""
from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ..export import ExportFormat

#: What the llama.cpp-family renderers write where the model file goes.
MODEL_PLACEHOLDER = "MODEL.gguf"


def tab_order(formats: Sequence[ExportFormat]) -> list[ExportFormat]:
    """The runtimes first, in the records' order (llama.cpp leads), COPE's own JSON record
    (``own_record``) last: the first tab, the one shown, is a command to run."""
    return [f for f in formats if not f.own_record] + [f for f in formats if f.own_record]


def uploaded_model_file(origin: Mapping[str, str]) -> str | None:
    """The uploaded GGUF's file name when the dataset uses one (``origin["model"]`` is
    ``"upload NAME.gguf"``), else None."""
    text = origin.get("model", "")
    if not text.startswith("upload ") or not text.lower().endswith(".gguf"):
        return None
    return text[len("upload "):]


def with_model_file(text: str, name: str | None) -> str:
    """``text`` with the uploaded model file's name (shell-quoted) in place of ``MODEL.gguf``."""
    return text.replace(MODEL_PLACEHOLDER, shlex.quote(name)) if name else text


def lead_command(text: str, language: str, command: str | None = None) -> tuple[str, int]:
    """The command a shell export leads with and how many other commands follow it: the
    renderer's own (``command``, :attr:`cope_core.export.Rendered.command`), else the text's first
    line that is not a comment; other languages (JSON, YAML) are their whole text."""
    if language != "bash":
        return text.rstrip("\n"), 0
    commands = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not commands:
        return text.rstrip("\n"), 0
    return (commands[0] if command is None else command), len(commands) - 1
