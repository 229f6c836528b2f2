"""The catalog as tables: what ``cope parts`` prints and what docs/parts.md lists (written by
``scripts/parts_doc.py``; a test holds the file to :func:`markdown`)."""
from __future__ import annotations

from typing import Any

from .catalog import cpus, gpus, link_generations, link_part, memory_part, memory_types, search
from .records import GB, GIB, CpuPart, GpuPart

LISTS = {"gpus": "gpu", "cpus": "cpu", "memory": "memory", "links": "link"}


def gpu_row(g: GpuPart) -> dict[str, Any]:
    return {"name": g.name, "label": g.label, "memory_gib": round(g.memory_bytes / GIB, 1),
            "bandwidth_gbs": g.bandwidth / GB, "fp16_tflops": g.flops / 1e12,
            "flops_kind": g.flops_kind, "flops_basis": g.flops_basis,
            "pcie": f"{g.pcie_gen}.0 x{g.pcie_lanes}", "link": g.link}


def cpu_row(c: CpuPart) -> dict[str, Any]:
    return {"name": c.name, "label": c.label,
            "cores": f"{c.cores}P+{c.e_cores}E" if c.e_cores else str(c.cores),
            "base_ghz": c.base_hz / 1e9, "boost_ghz": c.boost_hz / 1e9,
            "simd": f"{c.simd} {c.fma_units}x{c.fma_bits}", "flop_per_cycle": c.flop_per_cycle,
            "memory": c.memory, "memory_gbs": memory_part(c.memory).bandwidth / GB,
            "per_core_gbs": c.per_core_bandwidth / GB,
            "e_core": (f"{c.e_flops_per_thread / 1e9:g} GFLOP/s, {c.e_core_bandwidth / GB:g} GB/s"
                       if c.e_flops_per_thread and c.e_core_bandwidth else "")}


def rows(kind: str, text: str = "") -> list[dict[str, Any]]:
    """Display rows of the catalog's ``kind`` (``gpu``, ``cpu``, ``memory``, ``link``) whose
    name or label contains ``text``; each with its ``source``."""
    out = []
    for p in search(kind, text):
        if isinstance(p, GpuPart):
            r = gpu_row(p)
        elif isinstance(p, CpuPart):
            r = cpu_row(p)
        elif kind == "memory":
            r = {"name": p.name, "peak_gbs": p.bandwidth / GB}
        else:
            r = {"name": p.name, "per_direction_gbs": round(p.bandwidth / GB, 2)}
        out.append({**r, "source": p.source, "note": p.note})
    return out


def format_rows(table: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """A plain-text table of ``table``'s ``columns`` (default all but source and note)."""
    if not table:
        return "(none)"
    cols = columns or [c for c in table[0] if c not in ("source", "note")]
    text = [[_fmt(r[c]) for c in cols] for r in table]
    w = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(cols))]
    lines += ["  ".join(t[i].ljust(w[i]) for i in range(len(cols))) for t in text]
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def markdown() -> str:
    """docs/parts.md: every part with its numbers and its source."""
    out = ["# Parts catalog", "",
           "<!-- written by scripts/parts_doc.py from cope_core/parts/data; do not edit -->", "",
           "Machines are composed from these parts (`cope parts`, "
           "`cope_core.machine.compose_machine`). Numbers are the vendors' (GB/s and GB decimal, "
           "memory sizes binary GiB except where a vendor gives decimal GB); **basis** says "
           "whether the FP16 figure is *published* as such or *derived* by the rule in the "
           "note (tensor cores x FLOP per clock x boost clock, or a sparse figure halved). "
           "FP16 kinds: `tensor` = tensor cores at full-rate FP32 accumulate; "
           "`tensor-fp32acc` = GeForce tensor cores with FP32 accumulate (half the FP16-"
           "accumulate rate; what PyTorch uses); `matrix` = AMD WMMA; `vector` = packed FP16 "
           "on a GPU without matrix units. CPU FLOP/s per core = base clock x FMA units x lanes "
           "x 2; threads run on the P-cores of hybrid Intel parts. The bandwidth one core "
           "streams alone is an **assumption** for every catalog CPU (no vendor publishes it); "
           "`--cpu this` measures it.", "",
           "A part the catalog lacks is a JSON or TOML file with `kind` (`gpu` or `cpu`) and "
           "the columns below (name optional: the file's stem), e.g.", "",
           "```json",
           '{"kind": "gpu", "label": "My card", "vendor": "nvidia", "memory": "16 GiB", '
           '"bandwidth_gbs": 448, "fp16_tflops": 47.4, "flops_kind": "tensor-fp32acc", '
           '"flops_basis": "published", "pcie_gen": 5, "pcie_lanes": 8, '
           '"source": "vendor data sheet"}',
           "```", "",
           "`this` (`--gpu this`, `--cpu this`, `--memory this`; `cope parts this`) detects "
           "this machine: the CPU model and its physical cores (P-cores) from the OS, the GPU "
           "from nvidia-smi, rocm-smi or torch (none: CPU-only, and said so), the catalog's "
           "numbers for a model it lists, and the host memory's read bandwidth from a probe of "
           "about a second (all threads and one), and with `--cpu this` the rate a dot-product "
           "kernel streams weights at (8-bit, from memory by one thread and by all, from cache "
           "by one; about half a second more), the rate the CPU experts are priced at; every "
           "number is printed as catalog, derived, detected, measured or assumed.", ""]
    out += _section("GPUs", [gpu_row(g) | {"source": g.source, "note": g.note}
                             for g in gpus().values()],
                    ["name", "label", "memory_gib", "bandwidth_gbs", "fp16_tflops",
                     "flops_kind", "flops_basis", "pcie"])
    out += _section("CPUs", [cpu_row(c) | {"source": c.source, "note": c.note}
                             for c in cpus().values()],
                    ["name", "label", "cores", "base_ghz", "boost_ghz", "simd",
                     "flop_per_cycle", "memory", "memory_gbs", "per_core_gbs", "e_core"])
    out += ["## Memory", "",
            "A name `TYPE-MTSxCHANNELS` (`ddr4-3200x2`, `ddr5-6000x2`, `ddr5-4800x8`): peak = "
            "MT/s x 8 bytes x channels. The analytic model reaches 0.8 of it "
            "(`PlatformSpec.cpu_efficiency`, fitted on the paper's A100 cells, "
            "design.md#overheads-and-efficiencies); `--memory this` measures it instead.", ""]
    out += _table([{"type": n, "mt_s": f"{r['min_mts']}-{r['max_mts']}",
                    "bytes_per_transfer": r["bytes_per_transfer"], "source": r["source"],
                    "note": r["note"] or ""} for n, r in memory_types().items()],
                  ["type", "mt_s", "bytes_per_transfer"])
    out += ["## Links", "",
            "A name `pcieGENxLANES` or `GENxLANES` (`pcie3x16`, `pcie4x8`, `4x16`): per "
            "direction = rate x lanes x encoding / 8. A card runs at the lower generation and "
            "the fewer lanes of card and slot.", ""]
    out += _table([{"name": n, "gt_s": r["gt_s"], "encoding": r["encoding"],
                    "x16_gbs": round(link_part(n).bandwidth / GB, 2), "source": r["source"],
                    "note": r["note"] or ""} for n, r in link_generations().items()],
                  ["name", "gt_s", "encoding", "x16_gbs"])
    return "\n".join(out)


def _section(title: str, table: list[dict[str, Any]], cols: list[str]) -> list[str]:
    return [f"## {title} ({len(table)})", ""] + _table(table, cols)


def _table(table: list[dict[str, Any]], cols: list[str]) -> list[str]:
    head = cols + ["source"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        src = r["source"] + (f" — {r['note']}" if r.get("note") else "")
        cells = [_fmt(r[c]) for c in cols] + [src.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]
