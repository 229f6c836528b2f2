"""Several GPUs against published rows: each row of data/published/multigpu-rows.json priced
with the placement its command wrote, block by block (cope_core.llamacpp's ``blocks_tpot``: each
block's shared work on its layer's card, its routed experts on their card or the CPU, one
measured hand-off per crossing between cards), beside the published tokens/s, and the ratio of
each several-card row to the same rig's one-card row (what a user deciding on a second card
reads).

Nothing here is fitted to these rows: the hand-off is measured on another rig (PR #19922), the
cards, CPUs and memory are the catalog's. A row's file is priced as its preset's geometry with
the routed experts scaled to the file's size (the posters give the size, not every tensor's
type).

``python scripts/multigpu_rows.py`` prints the table; ``--write`` puts it into docs/results.md
between its markers; ``--check`` exits 1 when that block is not current.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_blocks import block_main  # noqa: E402

from cope_core.errors import CopeInputError  # noqa: E402
from cope_core.geometry import GIB, ModelGeometry  # noqa: E402
from cope_core.llamacpp import Cards, blocks_tpot, split_counts  # noqa: E402
from cope_core.machine import compose_machine  # noqa: E402
from cope_core.models import resolve_model  # noqa: E402

DATA = ROOT / "data" / "published" / "multigpu-rows.json"
SCHEMA = "cope.multigpu-rows/1"
START, END = "<!-- multigpu-rows:start -->", "<!-- multigpu-rows:end -->"
KEYS = ("id", "group", "source", "runtime", "command", "model", "machine", "split", "experts",
        "whole_ffn", "test", "context", "tokens_per_s")


def load(path: Path = DATA) -> list[dict]:
    """The rows, checked: every key there, sources https, the placement covering each block."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CopeInputError(f"cannot read the rows: {e}", source=str(path)) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise CopeInputError(f"expected schema {SCHEMA!r}", source=str(path), field="schema")
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise CopeInputError("expected a list of rows", source=str(path), field="rows")
    ids = {r.get("id") for r in rows if isinstance(r, dict)}
    for r in rows:
        missing = [k for k in KEYS if not isinstance(r, dict) or k not in r]
        if missing:
            raise CopeInputError(f"a row lacks {missing}", source=str(path), field="rows")
        if not r["source"].startswith("https://"):
            raise CopeInputError(f"{r['id']}: the source must be an https URL",
                                 source=str(path), field="source")
        if r.get("same_rig") is not None and r["same_rig"] not in ids:
            raise CopeInputError(f"{r['id']}: no row {r['same_rig']!r}", source=str(path),
                                 field="same_rig")
        if not r["tokens_per_s"] > 0:
            raise CopeInputError(f"{r['id']}: expected tokens/s > 0", source=str(path),
                                 field="tokens_per_s")
    return rows


def stored_as(g: ModelGeometry, file_gib: float) -> ModelGeometry:
    """``g`` with its routed experts scaled so the whole file is ``file_gib``."""
    experts = g.n_experts * sum(g.layer_expert_bytes)
    f = (file_gib * GIB - g.non_expert_bytes) / experts
    layers = tuple(dataclasses.replace(x, gate_bytes=round(x.gate_bytes * f),
                                       up_bytes=round(x.up_bytes * f),
                                       down_bytes=round(x.down_bytes * f))
                   for x in g.expert_layers)
    return dataclasses.replace(g, expert_layers=layers)


def predict(r: dict) -> float:
    """The row's predicted tokens/s."""
    g = stored_as(resolve_model(r["model"]["geometry"], r["model"]["preset"]),
                  r["model"]["file_gib"])
    mc = r["machine"]
    m = compose_machine(gpu=mc["gpu"], cpu=mc["cpu"], memory=mc["memory"], link=mc["pcie"],
                        threads=mc["threads"])
    cards = Cards.of(m)
    costs = cards.costs(g, m.threads, float(r["context"]))
    blocks = g.dense_layers + g.n_layers
    weights = [x.memory_bytes for x, _ in m.cards] if r["split"] == "free" else r["split"]
    counts = split_counts(blocks + 1, weights)
    attention = [i for i, c in enumerate(counts) for _ in range(c)][:blocks]
    experts: list[int | None] = [None if b < g.dense_layers else attention[b]
                                 for b in range(blocks)]
    for first, last, where in r["experts"]:
        for b in range(first, last + 1):
            experts[b] = attention[b] if where == "layer" else -1 if where == "cpu" else where
    return 1e6 / blocks_tpot(costs, attention, experts, cards.handoff(g))


def table() -> str:
    rows = load()
    pred = {r["id"]: predict(r) for r in rows}
    pub = {r["id"]: r["tokens_per_s"] for r in rows}
    out = ["| row (source) | model file | cards | placement | published tok/s | predicted | "
           "predicted / published | vs the same rig's one card: published | predicted |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        one = r.get("same_rig")
        versus = ("| | " if one is None else
                  f"| x{pub[r['id']] / pub[one]:.2f} | x{pred[r['id']] / pred[one]:.2f} ")
        place = ("split by free memory" if r["split"] == "free"
                 else f"-ts {','.join(str(x) for x in r['split'])}")
        place += "; experts " + ", ".join(
            f"{a}-{b} {'on their layer' if w == 'layer' else 'CPU' if w == 'cpu' else f'CUDA{w}'}"
            for a, b, w in r["experts"]) + ("; whole FFN moved" if r["whole_ffn"] else "")
        out.append(f"| [{r['id']}]({r['source']}) | {r['model']['file']} "
                   f"({r['model']['file_gib']:g} GiB) | {r['machine']['gpu'].replace(',', ' + ')}"
                   f" | {place} | {pub[r['id']]:.2f} | {pred[r['id']]:.2f} | "
                   f"{pred[r['id']] / pub[r['id']]:.2f} {versus}|")
    multi = [r for r in rows if r.get("same_rig")]
    agree = sum((pub[r["id"]] > pub[r["same_rig"]]) == (pred[r["id"]] > pred[r["same_rig"]])
                for r in multi)
    err = [abs(pred[k] / pub[k] - 1) for k in pub]
    out += ["", f"Mean absolute error {100 * sum(err) / len(err):.1f} % over {len(err)} rows; "
            f"the second card's sign (faster or slower than the same rig's one card) right in "
            f"{agree} of {len(multi)} pairs."]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(block_main(__doc__.split("\n")[0], ROOT / "docs" / "results.md", START, END,
                        table))
