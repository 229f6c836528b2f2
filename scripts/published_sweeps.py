"""What-ifs against published llama.cpp ``--n-cpu-moe`` sweeps (a second anchor beside the COPE
paper's A100 cells, docs/design.md#published-llamacpp-sweeps).

Each sweep in ``data/published/llamacpp-ncmoe-sweeps.json`` is decode tokens/s at several
``--n-cpu-moe`` N on one named GPU + CPU, copied with its source. Its machine's analytic
platform is built from published specs only (the file's ``platform``, each number sourced; the
overheads and efficiencies are the defaults fitted on the paper's cells, none fitted to these
points). The prediction of a point is llama.cpp's plain placement at N
(:func:`cope_core.llamacpp.cache.cache_search.placement_tpot`): the first N MoE layers' experts on
the CPU, the rest on the GPU. Compared are ratios between settings, tokens/s at N over tokens/s
at the sweep's first N, which cancel most machine constants; absolute tokens/s are shown too.

    python scripts/published_sweeps.py [--write | --check] [--json OUT]

``--write`` puts the table into docs/design.md and its summary into docs/results.md between their
published-sweeps markers; ``--check`` exits 1 when either is not current
(tests/test_paper_table.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

from doc_blocks import update_blocks  # beside this script, on sys.path when it runs

from cope_core.errors import CopeInputError
from cope_core.files import write_atomic
from cope_core.llamacpp import placement_tpot
from cope_core.models import resolve_model
from cope_core.platforms import PlatformSpec
from cope_core.profile.analytic import analytic_profile

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "published" / "llamacpp-ncmoe-sweeps.json"
SCHEMA = "cope.published-sweeps/1"
START, END = "<!-- published-sweeps:start -->", "<!-- published-sweeps:end -->"
US = 1e6


class Point(NamedTuple):
    sweep: str
    n_cpu_moe: int
    published_tps: float
    predicted_tps: float
    published_ratio: float      # tokens/s at N over tokens/s at the sweep's first N
    predicted_ratio: float

    @property
    def ratio_error(self) -> float:
        """Predicted over published ratio, less one."""
        return self.predicted_ratio / self.published_ratio - 1.0


def _need(obj: dict, key: str, kind: type | tuple, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise CopeInputError(f"{where}: missing {key!r}", source=str(DATA), field=key)
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CopeInputError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, got "
                             f"{value!r}", source=str(DATA), field=key)
    return value


def load(path: Path = DATA) -> list[dict]:
    """The sweeps of ``path``, checked: every point sourced, N in range, tokens/s positive."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CopeInputError(f"cannot read the published sweeps: {e}", source=str(path)) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise CopeInputError(f"expected schema {SCHEMA!r}", source=str(path), field="schema")
    sweeps = _need(doc, "sweeps", list, "the file")
    for s in sweeps:
        sid = _need(s, "id", str, "a sweep")
        for key in ("source", "title", "runtime", "command", "metric"):
            _need(s, key, str, sid)
        if not s["source"].startswith("https://"):
            raise CopeInputError(f"{sid}: 'source' must be an https URL", source=str(path),
                                 field="source")
        model = _need(s, "model", dict, sid)
        for key in ("name", "quant", "geometry", "preset", "why"):
            _need(model, key, str, f"{sid}.model")
        _need(s, "hardware", dict, sid)
        _need(s, "platform_sources", dict, sid)
        _need(s, "threads", int, sid)
        _need(s, "context", (int, float), sid)
        spec = PlatformSpec.from_dict(_need(s, "platform", dict, sid), source=str(path))
        for f in ("gpu_flops", "gpu_bandwidth", "link_bandwidth", "cpu_flops_per_thread",
                  "cpu_bandwidth", "cpu_bandwidth_per_thread"):
            if f not in s["platform_sources"]:
                raise CopeInputError(f"{sid}: no source for platform.{f}", source=str(path),
                                     field=f"platform_sources.{f}")
        g = resolve_model(model["geometry"], model["preset"])
        points = _need(s, "points", list, sid)
        if len(points) < 2:
            raise CopeInputError(f"{sid}: a sweep needs at least two points", source=str(path),
                                 field="points")
        for p in points:
            n = _need(p, "n_cpu_moe", int, f"{sid} point")
            tps = _need(p, "tokens_per_s", (int, float), f"{sid} point")
            if not 0 <= n <= g.n_layers or not tps > 0:
                raise CopeInputError(f"{sid}: point n_cpu_moe={n}, tokens_per_s={tps}: expected "
                                     f"N in [0, {g.n_layers}] and tokens/s > 0",
                                     source=str(path), field="points")
        s["_spec"], s["_model"] = spec, g
    return sweeps


def predict(sweep: dict) -> list[Point]:
    """Every point of one sweep: published and predicted tokens/s and their ratios to the first."""
    spec, g, t = sweep["_spec"], sweep["_model"], sweep["threads"]
    ctx = float(sweep["context"])
    prof = analytic_profile(g, spec, cpu_threads=[t], contexts=(int(ctx),), gpu_shares=(100.0,))
    ns = [p["n_cpu_moe"] for p in sweep["points"]]
    tpot = placement_tpot(prof, g, ns, ctx, cpu_threads=t, gpu_share=100.0)
    pred = [US / float(x) for x in tpot]
    pub = [float(p["tokens_per_s"]) for p in sweep["points"]]
    return [Point(sweep["id"], n, a, b, a / pub[0], b / pred[0])
            for n, a, b in zip(ns, pub, pred)]


def table(sweeps: list[dict], points: list[Point]) -> str:
    lines = ["| sweep (source) | model, file | GPU + CPU, memory | threads | N | published "
             "tok/s | predicted tok/s | ratio to first N: published | predicted | ratio error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_id = {s["id"]: s for s in sweeps}
    for p in points:
        s = by_id[p.sweep]
        first = p is next(q for q in points if q.sweep == p.sweep)
        head = (f"[{s['id']}]({s['source']}) | {s['model']['name']} {s['model']['quant']} | "
                f"{s['hardware']['gpu']} + {s['hardware']['cpu']}, {s['hardware']['memory']} | "
                f"{s['threads']}") if first else " | | |"
        err = "" if first else f"{100 * p.ratio_error:+.1f} %"
        lines.append(f"| {head} | {p.n_cpu_moe} | {p.published_tps:.2f} | "
                     f"{p.predicted_tps:.2f} | {p.published_ratio:.3f} | "
                     f"{p.predicted_ratio:.3f} | {err} |")
    return "\n".join(lines)


def summary(sweeps: list[dict], points: list[Point]) -> str:
    rest = [p for p in points if p.n_cpu_moe != _first(points, p)]     # the ratios
    ratio = sum(abs(p.ratio_error) for p in rest) / len(rest)
    absolute = sum(abs(p.predicted_tps / p.published_tps - 1) for p in points) / len(points)
    return (f"{len(sweeps)} published sweeps, {len(points)} points ({len(rest)} ratios): mean "
            f"|ratio error| {100 * ratio:.1f} % (target 15 %), largest "
            f"{100 * max(abs(p.ratio_error) for p in rest):.1f} %; mean |tokens/s error| "
            f"{100 * absolute:.1f} %")


def _first(points: list[Point], p: Point) -> int:
    return next(q.n_cpu_moe for q in points if q.sweep == p.sweep)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write every point here")
    ap.add_argument("--write", action="store_true",
                    help="update docs/design.md and docs/results.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if they are not current")
    args = ap.parse_args(argv)
    try:
        sweeps = load()
    except CopeInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    points = [p for s in sweeps for p in predict(s)]
    full, short = table(sweeps, points), summary(sweeps, points)
    print(full + "\n\n" + short)
    stale = update_blocks(START, END, ((ROOT / "docs" / "design.md", full + "\n\n" + short),
                                       (ROOT / "docs" / "results.md", short)),
                          args.write)
    if args.check and stale:
        print(f"not current: {', '.join(stale)}: run python3 scripts/published_sweeps.py "
              "--write", file=sys.stderr)
        return 1
    if args.json:
        write_atomic(Path(args.json), json.dumps(
            [p._asdict() | {"ratio_error": p.ratio_error} for p in points], indent=1) + "\n",
            overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
