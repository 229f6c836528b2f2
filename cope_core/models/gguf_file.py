"""A model's geometry from a GGUF file's header and tensor table (docs/design.md#model-files).

The ``gguf`` package (llama.cpp's gguf-py) parses the header, the metadata and the tensor
table; its reader is stopped before it maps any tensor's data, so a file's weights are never
read and a header alone (the first megabytes of a download) reads as well as the whole file.
Every tensor's stored type and exact bytes come from the table and the package's block sizes.

Tensor names are llama.cpp's (``gguf-py/gguf/constants.py``, ``MODEL_TENSOR``/``TENSOR_NAMES``):
``blk.N.ffn_{gate,up,down}_exps`` hold a block's routed experts stacked on the last dimension
(ggml order ``[hidden, inter, E]`` for gate and up, ``[inter, hidden, E]`` for down, with
``.bias`` beside them in gpt-oss), ``ffn_*_shexp`` the shared experts, ``blk.N.nextn.*`` a
multi-token-prediction block that decoding does not run (GLM-4.5's last block).
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from ..errors import CopeInputError
from ..geometry import ALIASES, CATALOG, ExpertTensors, ModelGeometry
from ..weight_formats import file_type_name

#: The architectures (``general.architecture``) whose MoE blocks follow llama.cpp's expert
#: tensor names, and the catalog entries of each family (checked for consistency).
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "qwen3moe": ("qwen3-30b-a3b", "qwen3-235b-a22b"),
    "qwen2moe": ("qwen1.5-moe-a2.7b",),
    "qwen35moe": ("qwen3.5-35b-a3b",),
    "deepseek2": ("deepseek-v2-lite", "deepseek-v3"),
    "llama": ("mixtral-8x7b",),
    "olmoe": ("olmoe-1b-7b",),
    "gpt-oss": ("gpt-oss-20b", "gpt-oss-120b"),
    "glm4moe": ("glm-4.5-air",),
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
_PROJ = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}


class TensorEntry(NamedTuple):
    """One row of the tensor table: name, stored type, ggml shape, bytes and data offset."""

    name: str
    type: str
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    offset: int


@dataclass(frozen=True)
class ModelFile:
    """What a model file said: the geometry, and what ``cope models --show`` prints besides."""

    geometry: ModelGeometry
    path: str
    kind: str                        # "gguf" or "hf-config"
    architecture: str
    details: tuple[tuple[str, str], ...]
    header_only: bool = False


class _HeaderReader(GGUFReader):
    """gguf's reader, stopped at the tensor table: no tensor data is mapped."""

    table: list[TensorEntry]

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        self.table = []
        for field in fields:
            _n, name_data, _nd, dims, raw_dtype, offset_tensor = field.parts
            t = GGMLQuantizationType(int(raw_dtype[0]))
            shape = tuple(int(d) for d in dims)
            n = 1
            for d in shape:
                n *= d
            block, size = GGML_QUANT_SIZES[t]
            self.table.append(TensorEntry(str(bytes(name_data), encoding="utf-8"), t.name, shape,
                                          n, n // block * size,
                                          int(start_offs + int(offset_tensor[0]))))


def _value(reader: _HeaderReader, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def read_gguf(path: str | os.PathLike) -> ModelFile:
    """Read a GGUF file's header and tensor table into a :class:`ModelFile`.

    Raises
    ------
    CopeInputError
        One line naming the file and the key or tensor at fault: not a GGUF, a truncated
        header, an architecture not listed in :data:`ARCHITECTURES`, a dense model, a missing
        key, or a tensor table that disagrees with the metadata.
    """
    src = os.fspath(path)
    size = os.path.getsize(src)
    try:
        reader = _HeaderReader(src, "r")
    except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as exc:
        what = ("not a GGUF file (no GGUF magic)" if "magic" in str(exc) else
                f"the GGUF header is truncated or damaged ({type(exc).__name__}: {exc})")
        raise CopeInputError(what, source=src, field="header") from None
    table = reader.table
    data_end = max((t.offset + t.n_bytes for t in table), default=reader.data_offset)
    return _geometry(src, reader, table, header_only=size < data_end)


def read_table(path: str | os.PathLike) -> tuple[str, dict[str, Any], list[TensorEntry]]:
    """A GGUF file's architecture, its ``<architecture>.*`` metadata (key without the prefix
    -> value) and its tensor table, for code that places tensors one by one (llama.cpp's
    ``--fit`` port); errors as :func:`read_gguf`'s."""
    src = os.fspath(path)
    try:
        reader = _HeaderReader(src, "r")
    except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as exc:
        raise CopeInputError(f"not a readable GGUF header ({type(exc).__name__}: {exc})",
                             source=src, field="header") from None
    arch = str(_need(reader, "general.architecture", src))
    meta = {k[len(arch) + 1:]: _value(reader, k) for k in reader.fields
            if k.startswith(arch + ".")}
    return arch, meta, reader.table


def _need(reader: _HeaderReader, key: str, src: str) -> Any:
    v = _value(reader, key)
    if v is None:
        raise CopeInputError("missing key", source=src, field=key)
    return v


def _geometry(src: str, reader: _HeaderReader, table: list[TensorEntry],
              header_only: bool) -> ModelFile:
    arch = _value(reader, "general.architecture")
    if arch is None:
        raise CopeInputError("missing key", source=src, field="general.architecture")
    arch = str(arch)
    if arch not in ARCHITECTURES:
        raise CopeInputError(f"unknown architecture {arch!r}; COPE reads the MoE architectures "
                             f"{sorted(ARCHITECTURES)}", source=src, field="general.architecture")
    by_block: dict[int, dict[int, list[TensorEntry]]] = {}
    for t in table:
        m = _BLOCK.match(t.name)
        if m is None:
            continue
        proj = _PROJ.get(m.group(2).split(".")[0])
        if proj is not None:
            by_block.setdefault(int(m.group(1)), {}).setdefault(proj, []).append(t)
    if _value(reader, f"{arch}.expert_count") is None and not by_block:
        raise CopeInputError(f"a dense model: no {arch}.expert_count key and no routed-expert "
                             "tensors (blk.N.ffn_*_exps); COPE prices MoE offloading",
                             source=src, field=f"{arch}.expert_count")
    blocks = int(_need(reader, f"{arch}.block_count", src))
    E = int(_need(reader, f"{arch}.expert_count", src))
    top_k = int(_need(reader, f"{arch}.expert_used_count", src))
    hidden = int(_need(reader, f"{arch}.embedding_length", src))
    heads = int(_need(reader, f"{arch}.attention.head_count", src))
    kv = _value(reader, f"{arch}.attention.head_count_kv")
    kv_heads = heads if kv is None else int(max(kv) if isinstance(kv, list) else kv)
    head_dim = _value(reader, f"{arch}.attention.value_length" if arch == "deepseek2"
                      else f"{arch}.attention.key_length") or hidden // heads
    nextn = int(_value(reader, f"{arch}.nextn_predict_layers") or 0)
    decode_blocks = blocks - nextn
    skipped = {i for i in by_block if i >= decode_blocks}
    moe = sorted(set(by_block) - skipped)
    if not moe:
        raise CopeInputError("no routed-expert tensors (blk.N.ffn_*_exps) in the decoded blocks",
                             source=src, field="tensors")
    layers, inter = [], None
    for i in moe:
        parts = by_block[i]
        if sorted(parts) != [0, 1, 2]:
            raise CopeInputError("expected ffn_gate_exps, ffn_up_exps and ffn_down_exps",
                                 source=src, field=f"blk.{i}")
        types, sizes = [], []
        for proj in range(3):
            weight = [t for t in parts[proj] if t.name.endswith(".weight")]
            if len(weight) != 1 or len(weight[0].shape) != 3 or weight[0].shape[2] != E:
                raise CopeInputError(f"expected one [*, *, {E}] weight ({arch}.expert_count="
                                     f"{E})", source=src,
                                     field=f"blk.{i}.{list(_PROJ)[proj]}")
            w = weight[0]
            row, width = (w.shape[0], w.shape[1]) if proj < 2 else (w.shape[1], w.shape[0])
            if row != hidden:
                raise CopeInputError(f"rows of {row} weights but {arch}.embedding_length is "
                                     f"{hidden}", source=src, field=w.name)
            if inter is None:
                inter = width
            elif width != inter:
                raise CopeInputError(f"expert width {width} but earlier MoE blocks have {inter}",
                                     source=src, field=w.name)
            types.append(w.type)
            sizes.append(sum(t.n_bytes for t in parts[proj]) // E)
        layers.append(ExpertTensors(types[0], types[1], types[2], *sizes))
    assert inter is not None
    declared = _value(reader, f"{arch}.expert_feed_forward_length")
    if declared is not None and int(declared) != inter and arch != "llama":
        raise CopeInputError(f"{declared} but the expert tensors are {inter} wide",
                             source=src, field=f"{arch}.expert_feed_forward_length")
    shared_count = _value(reader, f"{arch}.expert_shared_count")
    shexp = [t for t in table if ".ffn_gate_shexp.weight" in t.name]
    if shared_count is not None:
        n_shared = int(shared_count)
    else:
        n_shared = max(1, round(shexp[0].shape[1] / inter)) if shexp else 0
    embd = [t for t in table if t.name == "token_embd.weight"]
    vocab = embd[0].shape[1] if embd else int(_need(reader, f"{arch}.vocab_size", src))
    routed = {t.name for b in by_block.values() for p in b.values() for t in p}
    not_decoded = set(range(decode_blocks, blocks))
    kept = [t for t in table if t.name not in routed and not _in_blocks(t.name, not_decoded)]
    ftype = _value(reader, "general.file_type")
    fmt = file_type_name(ftype) if ftype is not None else _dominant(layers)
    name = os.path.splitext(os.path.basename(src))[0].lower().removesuffix(".header")
    g = ModelGeometry(name=name, n_layers=len(moe), n_experts=E, top_k=top_k, hidden=hidden,
                      expert_intermediate=int(inter), dtype_bytes=2, n_shared_experts=n_shared,
                      dense_layers=decode_blocks - len(moe), n_heads=heads, n_kv_heads=kv_heads,
                      head_dim=int(head_dim), vocab=int(vocab),
                      non_expert_bytes=sum(t.n_bytes for t in kept), weight_format=fmt,
                      expert_layers=tuple(layers),
                      non_expert_params=sum(t.n_elements for t in kept))
    check_family(g, arch, [str(_value(reader, k) or "") for k in ("general.name",
                                                                  "general.basename")], src)
    details = (("architecture", arch), ("file type", fmt),
               ("blocks", f"{blocks} ({len(moe)} MoE, {g.dense_layers} dense"
                          + (f", {nextn} multi-token-prediction not decoded)" if nextn else ")")),
               ("tensors", f"{len(table)}; data "
                           + ("absent (header only)" if header_only else "present")))
    return ModelFile(g, src, "gguf", arch, details, header_only)


def _in_blocks(name: str, blocks: set[int]) -> bool:
    m = _BLOCK.match(name)
    return m is not None and int(m.group(1)) in blocks


def _dominant(layers: list[ExpertTensors]) -> str:
    counts: dict[str, int] = {}
    for x in layers:
        for t, b in x.projections():
            counts[t] = counts.get(t, 0) + b
    return max(counts, key=lambda t: counts[t])


def check_family(g: ModelGeometry, arch: str, names: list[str], src: str) -> None:
    """Warn when a file names a catalog model of its family but its shape differs."""
    keys = [ALIASES.get(k, k) for k in (n.lower().replace(" ", "-") for n in names)]
    key = next((k for k in keys if k in ARCHITECTURES.get(arch, ()) and k in CATALOG), None)
    if key is not None:
        ref = CATALOG[key]
        fields = ("n_layers", "n_experts", "top_k", "hidden", "expert_intermediate",
                  "dense_layers", "vocab")
        diff = [f"{f} {getattr(g, f)} (catalog {getattr(ref, f)})" for f in fields
                if getattr(g, f) != getattr(ref, f)]
        if diff:
            warnings.warn(f"{src}: general.name names {key}, but the file has "
                          + ", ".join(diff), UserWarning, stacklevel=2)
