"""What ``cope models --show`` and the app print about a model: one list of rows."""
from __future__ import annotations

from ..geometry import GIB, MIB, ModelGeometry
from .formats import COMMON, NATIVE_MXFP4, apply_preset
from .gguf_file import ModelFile


def layer_runs(g: ModelGeometry) -> list[tuple[int, int, str]]:
    """Runs of MoE layers that store their experts alike: ``(first, last, text)``."""
    if not g.expert_layers:
        t = g.format_name
        return [(0, g.n_layers - 1, f"gate/up/down {t}, {g.expert_bytes / MIB:.3f} MiB")]
    runs: list[tuple[int, int, str]] = []
    for i, x in enumerate(g.expert_layers):
        text = (f"gate {x.gate_type} {x.gate_bytes:,} B, up {x.up_type} {x.up_bytes:,} B, "
                f"down {x.down_type} {x.down_bytes:,} B = {x.total / MIB:.3f} MiB")
        if runs and runs[-1][2] == text and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i, text)
        else:
            runs.append((i, i, text))
    return runs


def describe(g: ModelGeometry, mf: ModelFile | None = None) -> list[tuple[str, str]]:
    """``(field, value)`` rows: what was read and every byte count the pricing uses."""
    rows: list[tuple[str, str]] = []
    if mf is not None:
        rows += [("file", mf.path), ("read as", mf.kind)] + list(mf.details)
    rows += [
        ("name", g.name), ("weights", g.format_name),
        ("MoE layers (L)", str(g.n_layers)), ("leading dense blocks", str(g.dense_layers)),
        ("routed experts (E)", str(g.n_experts)), ("experts per token (top-k)", str(g.top_k)),
        ("shared experts", str(g.n_shared_experts)),
        ("hidden / expert width", f"{g.hidden} / {g.expert_intermediate}"),
        ("attention heads / KV heads / head dim", f"{g.n_heads} / {g.n_kv_heads} / {g.head_dim}"),
        ("vocabulary", str(g.vocab)),
        ("one expert (mean over layers)", f"{g.expert_bytes / MIB:.3f} MiB"),
        ("one expert in every layer (VRAM per K)", f"{g.per_k_bytes / MIB:.1f} MiB"),
        ("all routed experts", f"{g.all_expert_bytes / GIB:.3f} GiB"),
        ("non-expert weights", f"{g.non_expert_bytes / GIB:.3f} GiB"
         + (f" ({g.non_expert_params:,} parameters)" if g.non_expert_params else "")),
    ]
    for a, b, text in layer_runs(g):
        rows.append((f"MoE layers {a}-{b}" if a != b else f"MoE layer {a}", text))
    return rows


def preset_mib(g: ModelGeometry) -> dict[str, float | None]:
    """MiB per expert (mean over layers) of a catalog entry in each :data:`COMMON` preset;
    None where the family's files keep another format (gpt-oss: MXFP4 experts)."""
    out: dict[str, float | None] = {}
    for p in COMMON:
        native = g.name.startswith(NATIVE_MXFP4) and p not in ("BF16", "MXFP4_MOE")
        out[p] = None if native else apply_preset(g, p).expert_bytes / MIB
    return out
