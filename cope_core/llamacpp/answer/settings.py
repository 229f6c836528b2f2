"""How llama.cpp is run, for its memory: the settings record (:class:`LlamaSettings`: the model
file's tensor table, ``-c``, ``-ctk``/``-ctv``, ``-fitt``), made from what a user gives
(:func:`llama_settings`), and the device memory a plain ``--n-cpu-moe`` placement takes under it
(:func:`n_cpu_moe_memory`). Each default is written once, here; the command line's options read
them (``cope_core.cli.args``)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ...errors import CopeInputError
from ...geometry import DEFAULT_CONTEXT, GIB, ModelGeometry
from ..placement.command import ALL_EXPERTS, n_cpu_moe_patterns
from ..placement.fit import FIT_MARGIN
from ..placement.vram import (
    N_BATCH,
    N_UBATCH,
    DeviceMemory,
    LlamaModel,
    Placement,
    device_memory,
    llama_model_of,
    read_llama_model,
    row_bytes,
)
from .builds import Build, latest


@dataclass(frozen=True)
class LlamaSettings:
    """How llama.cpp is run, for its memory: the model file's tensor table (None: made from
    the geometry, :func:`~cope_core.llamacpp.placement.vram.llama_model_of`), the context
    (``-c``) and KV cache types (``-ctk``/``-ctv``), ``--fit``'s margin (``-fitt``), the
    build (:mod:`~cope_core.llamacpp.answer.builds`: its flags, cache and default; None: the newest
    known, :attr:`runs_on`), and the batch the compute buffer is reserved for (``-ub``, ``-b``;
    ``op_offload`` False: ``--no-op-offload``), and the host memory (bytes; None: not known)
    that ``--no-mmap``'s pinned host experts must fit in (the request's search prices it only
    when it is known)."""

    model: LlamaModel | None = None
    n_ctx: int = DEFAULT_CONTEXT
    type_k: str = "f16"
    type_v: str = "f16"
    margin_bytes: int = FIT_MARGIN
    build: Build | None = None
    n_ubatch: int = N_UBATCH
    n_batch: int = N_BATCH
    op_offload: bool = True
    host_ram_bytes: float | None = None

    @property
    def runs_on(self) -> Build:
        """The build assumed: the one given, else the newest known."""
        return self.build if self.build is not None else latest()

    def table(self, g: ModelGeometry) -> LlamaModel:
        return self.model if self.model is not None else llama_model_of(g)

    def fixed_bytes(self, g: ModelGeometry) -> int:
        """What llama.cpp counts on the GPU with every routed expert in host memory: the other
        weights but the token embedding, the KV cache at ``n_ctx``, the compute buffer."""
        return device_memory(self.table(g), Placement(-1, (ALL_EXPERTS,)), self.n_ctx,
                             self.type_k, self.type_v, n_ubatch=self.n_ubatch,
                             n_batch=self.n_batch, op_offload=self.op_offload).total


def llama_settings(model: str | os.PathLike | LlamaModel | None, *,
                   n_ctx: int = LlamaSettings.n_ctx, margin_bytes: int = LlamaSettings.margin_bytes,
                   type_k: str = LlamaSettings.type_k,
                   type_v: str = LlamaSettings.type_v, build: Build | None = None,
                   n_ubatch: int = LlamaSettings.n_ubatch,
                   n_batch: int = LlamaSettings.n_batch,
                   op_offload: bool = LlamaSettings.op_offload,
                   host_ram_gib: float | None = None) -> LlamaSettings:
    """:class:`LlamaSettings` from a GGUF file's path (its header is read), a table, or None
    (made from the priced geometry); the context must be a positive whole number; ``build`` the
    llama.cpp build assumed (None: the newest known)."""
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
        raise CopeInputError(f"expected a positive whole number of tokens, got {n_ctx!r}",
                             field="--ctx")
    for flag, t in (("--cache-type-k", type_k), ("--cache-type-v", type_v)):
        try:
            row_bytes(t, 256)
        except CopeInputError as exc:
            raise CopeInputError(exc.detail, field=flag) from None
    for flag, n in (("--ubatch-size", n_ubatch), ("--batch-size", n_batch)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise CopeInputError(f"expected a positive whole number of tokens, got {n!r}",
                                 field=flag)
    if host_ram_gib is not None and (isinstance(host_ram_gib, bool) or not isinstance(
            host_ram_gib, (int, float)) or not 0 < host_ram_gib < float("inf")):
        raise CopeInputError(f"expected GiB of host memory > 0, got {host_ram_gib!r}",
                             field="--ram-gib")
    table = read_llama_model(model) if isinstance(model, (str, os.PathLike)) else model
    return LlamaSettings(table, n_ctx, type_k, type_v, int(margin_bytes), build, n_ubatch,
                         n_batch, bool(op_offload),
                         None if host_ram_gib is None else float(host_ram_gib) * GIB)


def n_cpu_moe_memory(g: ModelGeometry, n_cpu_moe: int, vram_gib: float,
                     llama: LlamaSettings | None = None) -> DeviceMemory:
    """llama.cpp's count of the GPU's memory under ``-ngl 99 --n-cpu-moe N`` (the routed experts
    of blocks ``0 .. N-1`` in host memory), refused with how much it is over when it exceeds
    the budget.

    Parameters
    ----------
    g : ModelGeometry
        The model (its tensor table from ``llama.model`` when given, else made from it).
    n_cpu_moe : int
        ``--n-cpu-moe``: blocks counted from block 0, a dense prefix included.
    vram_gib : float
        The budget (the device memory the flags may use).
    llama : LlamaSettings, optional
        ``-c``, ``-ctk``/``-ctv`` and the table.
    """
    s = llama or LlamaSettings()
    m = s.table(g)
    if isinstance(n_cpu_moe, bool) or not isinstance(n_cpu_moe, int) \
            or not 0 <= n_cpu_moe <= m.n_layer:
        raise CopeInputError(f"expected a whole number of blocks in [0, {m.n_layer}], got "
                             f"{n_cpu_moe!r}", field="--n-cpu-moe")
    mem = device_memory(m, Placement(-1, n_cpu_moe_patterns(n_cpu_moe)), s.n_ctx, s.type_k,
                        s.type_v, n_ubatch=s.n_ubatch, n_batch=s.n_batch,
                        op_offload=s.op_offload)
    over = mem.total - float(vram_gib) * GIB
    if over > 0:
        raise CopeInputError(
            f"--n-cpu-moe {n_cpu_moe} does not fit {vram_gib:g} GiB: llama.cpp counts "
            f"{mem.total / GIB:.2f} GiB on the GPU (weights {mem.model / GIB:.2f}, KV cache "
            f"{mem.context / GIB:.2f} at -c {s.n_ctx} {s.type_k}/{s.type_v}, compute buffer "
            f"{mem.compute / GIB:.2f}): over by {over / GIB:.2f} GiB", field="--n-cpu-moe")
    return mem
