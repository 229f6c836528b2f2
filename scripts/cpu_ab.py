"""The published CPU A/Bs of issue 53 (data/published/cpu-ab-sets.json), priced: per set what
changed and each run's decode tokens/s as published; per priced run the model's tokens/s, its
error, and its ratio to the set's first run against the published ratio; per memory pair the
memory-effect ratio (the predicted rise over the measured rise).

    python scripts/cpu_ab.py [--write | --check]
    python scripts/cpu_ab.py --record-before   # keep today's predictions as "before"

Each priced set carries a ``price`` block (model, preset, CPU, memory, context and the runs
priced, with every assumption the source leaves open); a set that cannot be priced says why in
``not_priced``. Memory pairs also come from the published ``--n-cpu-moe`` sweeps that differ only
in the memory clock (data/published/llamacpp-ncmoe-sweeps.json, priced as
scripts/published_sweeps.py prices them). They check the CPU model; nothing is fitted to them.
``--record-before`` writes benchmarks/results/cpu-ab-before.json, the predictions of the model
as it stands, which the table shows beside the current one; ``--write`` puts the tables into
docs/results.md between its cpu-ab markers; ``--check`` exits 1 when they are not current
(tests/test_published_ab.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import published_sweeps  # beside this script, on sys.path when it runs
from doc_blocks import block_main

from cope_core import parts
from cope_core.estimate.cpu_only import host_spec, spec_tpot
from cope_core.files import write_atomic
from cope_core.models import resolve_model

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "published" / "cpu-ab-sets.json"
BEFORE = ROOT / "benchmarks" / "results" / "cpu-ab-before.json"
ERROR = ROOT / "cope_core" / "estimate" / "data" / "cpu-ab-error.json"
START, END = "<!-- cpu-ab:start -->", "<!-- cpu-ab:end -->"
US = 1e6


class Priced(NamedTuple):
    set: str
    run: int
    setting: str
    threads: int
    preset: str
    memory: str
    published: float            # tokens/s
    predicted: float


def _memory(price: dict, run: dict) -> parts.MemoryPart:
    if "memory_measured_gbs" in price:
        gbs = float(price["memory_measured_gbs"])
        return parts.MemoryPart(name=f"measured {gbs:g} GB/s", kind="measured", mts=0,
                                channels=0, bandwidth=gbs * 1e9, measured=True,
                                source=price["assumed"], note="")
    return parts.memory_part(run.get("memory", price.get("memory")))


def price_set(s: dict) -> list[Priced]:
    """Every priced run of one set, CPU alone (``llama-bench -ngl 0``), at its threads."""
    price = s["price"]
    cpu = parts.cpu_part(price["cpu"])
    out = []
    for r in price["runs"]:
        preset = r.get("preset", price["preset"])
        g = resolve_model(price["model"], preset)
        mem = _memory(price, r)
        tpot = spec_tpot(g, host_spec(cpu, mem), int(r["threads"]), float(price["context"]))
        run = s["runs"][r["run"]]
        out.append(Priced(s["name"], r["run"], run["setting"], int(r["threads"]), preset,
                          mem.name, float(run["tg_tokens_per_s"]), US / tpot))
    return out


def sweep_pairs() -> list[tuple[str, list[Priced]]]:
    """The published ``--n-cpu-moe`` sweeps that differ only in the memory clock: per N, the
    two machines' points as priced runs (threads: the sweep's)."""
    sweeps = published_sweeps.load()
    by_title: dict[str, list[dict]] = {}
    for s in sweeps:
        by_title.setdefault(s["source"], []).append(s)
    out = []
    for group in by_title.values():
        if len(group) != 2:
            continue
        pts = [published_sweeps.predict(s) for s in group]
        for a, b in zip(*pts):
            if a.n_cpu_moe != b.n_cpu_moe or a.n_cpu_moe == 0:
                continue                # no expert on the CPU: nothing for memory to move
            out.append((f"{group[0]['id']} vs {group[1]['id']}, --n-cpu-moe {a.n_cpu_moe}",
                        [Priced(s["id"], p.n_cpu_moe, s["hardware"]["memory"], s["threads"],
                                s["model"]["preset"], s["platform"]["name"], p.published_tps,
                                p.predicted_tps) for s, p in zip(group, (a, b))]))
    return out


def priced() -> list[Priced]:
    data = json.loads(DATA.read_text())
    return [p for s in data["sets"] if s.get("price") for p in price_set(s)]


def _key(p: Priced) -> str:
    return f"{p.set}#{p.run}#{p.memory}"


def _before() -> dict[str, float]:
    if not BEFORE.exists():
        return {}
    return json.loads(BEFORE.read_text())["predicted"]


def record_before() -> None:
    runs = priced() + [p for _, pair in sweep_pairs() for p in pair]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    write_atomic(BEFORE, json.dumps({"what": "scripts/cpu_ab.py --record-before",
                                     "commit": commit,
                                     "predicted": {_key(p): p.predicted for p in runs}},
                                    indent=1) + "\n", overwrite=True)
    print(f"wrote {BEFORE}")


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.1f} %"


def priced_table(runs: list[Priced], before: dict[str, float]) -> tuple[str, dict]:
    """The priced runs' table and the summary numbers (mean |tokens/s error| and mean |ratio
    error|, before and now)."""
    lines = ["| set | run | threads | published t/s | before: predicted | error | ratio error "
             "| now: predicted | error | ratio error |", "|---" * 10 + "|"]
    errs: dict[str, list[float]] = {"tps_before": [], "tps_now": [], "ratio_before": [],
                                    "ratio_now": []}
    first: dict[tuple[str, str], Priced] = {}
    for p in runs:
        f = first.setdefault((p.set, p.preset), p)
        old = before.get(_key(p))
        cells = []
        for tag, pred, fpred in (("before", old, before.get(_key(f))),
                                 ("now", p.predicted, f.predicted)):
            if pred is None or fpred is None:
                cells += ["", "", ""]
                continue
            err = pred / p.published - 1
            ratio = None if f is p else (pred / fpred) / (p.published / f.published) - 1
            errs[f"tps_{tag}"].append(abs(err))
            if ratio is not None:
                errs[f"ratio_{tag}"].append(abs(ratio))
            cells += [f"{pred:.2f}", _pct(err), _pct(ratio)]
        lines.append(f"| `{p.set}` | {p.setting} ({p.preset}) | {p.threads} | "
                     f"{p.published:g} | " + " | ".join(cells) + " |")
    mean = {k: (sum(v) / len(v) if v else None) for k, v in errs.items()}
    return "\n".join(lines), mean


def memory_table(runs: list[Priced], before: dict[str, float]) -> str:
    data = json.loads(DATA.read_text())
    pairs = [(f"`{s['name']}`", [p for p in runs if p.set == s["name"]])
             for s in data["sets"] if s.get("price") and s["changed"] == "memory_clock"]
    pairs += sweep_pairs()
    lines = ["| memory A/B | slower memory: published t/s | faster | measured rise | "
             "predicted rise, before | memory-effect ratio, before | predicted rise, now | "
             "memory-effect ratio, now |", "|---|---|---|---|---|---|---|---|"]
    for name, (a, b) in pairs:
        if a.published > b.published:
            a, b = b, a
        measured = b.published / a.published - 1
        cells = []
        for pa, pb in ((before.get(_key(a)), before.get(_key(b))), (a.predicted, b.predicted)):
            if pa is None or pb is None:
                cells += ["", ""]
                continue
            rise = pb / pa - 1
            cells += [_pct(rise), f"{100 * rise / measured:.0f} %"]
        lines.append(f"| {name} | {a.published:g} | {b.published:g} | {_pct(measured)} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def sets_table(data: dict) -> str:
    lines = ["| set | changed | runs (setting: tg tokens/s) | slowest to fastest | priced | "
             "source |", "|---|---|---|---|---|---|"]
    for s in data["sets"]:
        runs = [(r["setting"], float(r["tg_tokens_per_s"])) for r in s["runs"]
                if r.get("tg_tokens_per_s") is not None]
        if not runs:
            continue
        low, best = min(t for _, t in runs), max(t for _, t in runs)
        shown = "; ".join(f"{k}: {t:g}" for k, t in runs[:6]) + (
            f"; … ({len(runs)} runs)" if len(runs) > 6 else "")
        source = s["source"].split(" ")[0]
        label = "/".join(source.rstrip("/").split("/")[-3:]) if "github.com" in source \
            else source.split("/")[2]
        why = (f"{len(s['price']['runs'])} runs: {s['price']['assumed']}" if s.get("price")
               else f"no: {s['not_priced']}")
        lines.append(f"| `{s['name']}` | {s['changed']} | {shown} | x{best / low:.2f} | {why} "
                     f"| [{label}]({source}) |")
    return "\n".join(lines)


def table() -> str:
    data = json.loads(DATA.read_text())
    runs, before = priced(), _before()
    body, mean = priced_table(runs, before)
    n = sum(1 for s in data["sets"] if any(r.get("tg_tokens_per_s") for r in s["runs"]))
    by = sorted({s["changed"] for s in data["sets"]})
    counts = ", ".join(f"{sum(s['changed'] == c for s in data['sets'])} {c}" for c in by)

    def m(k: str) -> str:
        return "-" if mean[k] is None else f"{100 * mean[k]:.1f} %"
    commit = json.loads(BEFORE.read_text())["commit"] if BEFORE.exists() else "-"
    return "\n".join([
        sets_table(data), "", f"{n} sets ({counts}), collected {data['collected']}; what each "
        "source does not state is in the file.", "", "Priced (CPU alone, at each run's threads; "
        f"before: the model at commit {commit}, benchmarks/results/cpu-ab-before.json):", "",
        body, "", f"{len(runs)} priced runs: mean |tokens/s error| {m('tps_before')} before, "
        f"{m('tps_now')} now; mean |ratio error| {m('ratio_before')} before, {m('ratio_now')} "
        "now.", "", "Memory A/Bs:", "", memory_table(runs, before)])


def memory_shares(runs: list[Priced]) -> list[dict]:
    """Each memory A/B's predicted rise as a share of the measured one."""
    data = json.loads(DATA.read_text())
    pairs = [(s["name"], [p for p in runs if p.set == s["name"]])
             for s in data["sets"] if s.get("price") and s["changed"] == "memory_clock"]
    pairs += [(name.strip("`"), pair) for name, pair in sweep_pairs()]
    out = []
    for name, (a, b) in pairs:
        if a.published > b.published:
            a, b = b, a
        measured = b.published / a.published - 1
        out.append({"pair": name, "measured_rise": measured,
                    "predicted_rise": b.predicted / a.predicted - 1,
                    "share": (b.predicted / a.predicted - 1) / measured})
    return out


def error_summary() -> dict:
    """What the upgrade lines of ``cope advise`` carry: the model's measured error on these
    sets (cope_core/estimate/data/cpu-ab-error.json)."""
    runs = priced()
    _, mean = priced_table(runs, {})
    shares = memory_shares(runs)
    return {"what": "the CPU model's error on the published CPU A/Bs and the memory-clock "
                    "pairs of the --n-cpu-moe sweeps (scripts/cpu_ab.py --write; "
                    "docs/results.md#published-cpu-ab-sets)",
            "priced_runs": len(runs), "tokens_per_s_error": mean["tps_now"],
            "ratio_error": mean["ratio_now"], "memory_pairs": shares,
            "channel_pairs": 0}


def write_error(write: bool) -> list[str]:
    text = json.dumps(error_summary(), indent=1) + "\n"
    if ERROR.exists() and ERROR.read_text() == text:
        return []
    if write:
        write_atomic(ERROR, text, overwrite=True)
    return [ERROR.name]


def main() -> int:
    if sys.argv[1:] == ["--record-before"]:
        record_before()
        return 0
    return block_main(__doc__.splitlines()[0], ROOT / "docs" / "results.md", START, END, table,
                      also=write_error)


if __name__ == "__main__":
    raise SystemExit(main())
