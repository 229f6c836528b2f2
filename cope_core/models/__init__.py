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
#: The llama-quantize preset most published GGUFs of a catalog model keep their experts in,
#: where it is not Q4_K_M: every published gpt-oss GGUF (ggml-org/gpt-oss-20b-GGUF and
#: gpt-oss-120b-GGUF, unsloth's) stores the experts in MXFP4, as OpenAI released them.
PUBLISHED_PRESETS: dict[str, str] = {"gpt-oss-20b": "MXFP4_MOE", "gpt-oss-120b": "MXFP4_MOE"}
#: Elsewhere: the preset the model pages, LM Studio and Ollama offer first.
USUAL_PRESET = "Q4_K_M"


def published_preset(name: str) -> str | None:
    """The preset a user who downloads catalog model ``name`` most likely has (None: not a
    catalog name, e.g. a file, whose types are its own)."""
    if os.path.exists(name) or os.sep in name or name.lower().endswith((".gguf", ".json")):
        return None
    key = get_model(name).name                  # raises with the catalog's names
    return PUBLISHED_PRESETS.get(key, USUAL_PRESET)


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


__all__ = ["COMMON", "PUBLISHED_PRESETS", "USUAL_PRESET", "ModelFile", "apply_preset",
           "published_preset", "read_gguf", "read_hf_config", "read_model_file",
           "resolve_model"]
