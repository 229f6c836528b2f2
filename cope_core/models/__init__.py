"""Models as users have them: a catalog name (optionally in a llama-quantize preset), a GGUF
file's header, or a Hugging Face config (docs/design.md#model-files)."""
from __future__ import annotations

import os

from ..errors import CopeInputError
from ..geometry import ModelGeometry, get_model
from .formats import COMMON, apply_preset
from .gguf_file import ModelFile, read_gguf
from .hf_config import read_hf_config

_MAGIC = b"GGUF"


def read_model_file(path: str, quant: str | None = None) -> ModelFile:
    """A GGUF file (by its magic) or an HF model folder / ``config.json``."""
    if os.path.isdir(path) or path.endswith(".json"):
        return read_hf_config(path, quant)
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != _MAGIC and not path.lower().endswith(".gguf"):
        raise CopeInputError("expected a GGUF file, a model folder or a config.json",
                             source=path, field="--model")
    if quant is not None:
        raise CopeInputError("a GGUF file stores its own types; --quant applies to catalog "
                             "names and HF configs", source=path, field="--quant")
    return read_gguf(path)


def resolve_model(text: str, quant: str | None = None) -> ModelGeometry:
    """``--model``: a catalog name, or the path of a GGUF file, model folder or config.json;
    ``quant`` prices a catalog entry or config in a llama-quantize preset."""
    if os.path.exists(text):
        return read_model_file(text, quant).geometry
    if os.sep in text or text.lower().endswith((".gguf", ".json")):
        raise CopeInputError("no such file", source=text, field="--model")
    g = get_model(text)
    return apply_preset(g, quant) if quant else g


__all__ = ["COMMON", "ModelFile", "apply_preset", "read_gguf", "read_hf_config",
           "read_model_file", "resolve_model"]
