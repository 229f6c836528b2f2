"""The controlled grid's report (``benchmarks/fidelity_grid.py`` runs the grid): the settings'
names, the per-cell rows from ``cope evaluate --per-k --json``, the measured margins, the
platforms' cost ratios, contention, bias, residency gaps and the prefetch ablation, and the
Markdown tables of ``report.md``."""
from __future__ import annotations

from pathlib import Path

from cope_core.estimate.costs import ESTIMATORS

ROOT = Path(__file__).resolve().parent.parent


def settings_of(text: str) -> list[tuple[float | None, float]]:
    out = []
    for item in text.split(","):
        link, slow = item.split(":")
        out.append((None if link == "none" else float(link), float(slow)))
    return out


def tag(link: float | None, slow: float) -> str:
    return f"link-{'unpaced' if link is None else f'{link:g}'}-slow-{slow:g}"


def cells_of(ev: dict, link: float | None, slow: float) -> list[dict]:
    """One row per (K, threads) cell of one setting's ``cope evaluate --per-k --json``."""
    rows: dict[tuple, dict] = {}
    for est in ESTIMATORS:
        e = ev.get(est)
        if not e:
            continue
        for c in e["per_k"]:
            key = (c["K"], c["cpu_threads"])
            row = rows.setdefault(key, {"link_gbps": link, "cpu_slowdown": slow, "K": c["K"],
                                        "cpu_threads": c["cpu_threads"],
                                        "measured": c["measured"],
                                        "tied": [t for t in c["measured_tied"]
                                                 if t != c["measured"]]})
            row[est] = {"pick": c["predicted"], "agree": c["agree"],
                        "within_noise": c["within_noise"], "regret_pct": c["regret_pct"],
                        "mape_pct": c["mape_pct"]}
    return list(rows.values())


def margins(measurements: Path, trace: Path, cal: Path, profile: Path
            ) -> dict[tuple, tuple[str | None, float, set[str]]]:
    """Per (K, threads): the fastest measured candidate that is not the same policy as the
    measured winner on this trace and platform (``predict``'s ``equivalent_to``), the winner's
    margin over it in %, and the candidates that are the winner's policy."""
    import warnings

    from cope_core import parquet_io, predict
    from cope_core.estimate.evaluate import measured_tpot
    from cope_core.estimate.ranking import fastest_first, policy_of, runner_up
    t = parquet_io.read_measurements(measurements).table
    tr, c = parquet_io.read_trace(trace), parquet_io.read_trace(cal)
    prof = parquet_io.read_profile(profile)
    out = {}
    for (k, th), grp in t.groupby(["K", "cpu_threads"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = predict(tr, prof, [int(k)], c, cpu_threads=int(th), draws=0)
        eq = {c: e if isinstance(e, str) else None
              for c, e in zip(df["candidate"], df["equivalent_to"])}
        # the library's measured TPOT: median over trials, mean over prompts
        m = measured_tpot(grp)
        mean = dict(zip(m["candidate"], m["tpot_us"].astype(float)))
        best = fastest_first(mean)[0]
        ru = runner_up(mean, eq, best)
        same = {x for x in mean if policy_of(x, eq) == policy_of(best, eq)}
        out[(int(k), int(th))] = ((ru, 100 * (mean[ru] / mean[best] - 1), same)
                                  if ru is not None else (None, 0.0, same))
    return out


def _ratios(op) -> tuple[float, float]:
    """(CPU expert / accelerator expert, one expert's copy / accelerator expert) of an
    operating point's atomic rows: the shape of a platform, whatever its absolute speed."""
    r, c, s = op.atomic["gpu_expert"][1], op.atomic["cpu_expert"][1], op.atomic["stage"][1]
    return float(c / r), float(s / r)


def resemblance(profiles: dict[str, Path]) -> list[dict]:
    """Per grid setting and CPU-thread count: its ratios CPU expert : copy : accelerator expert
    (from its measured profile) and the catalog platform (GPU x link x CPU x threads, analytic,
    same model) whose ratios are nearest on a log scale."""
    import math

    from cope_core import parquet_io
    from cope_core.platforms import CPUS, GPUS, LINKS, platform_spec
    from cope_core.profile.analytic import analytic_profile
    out = []
    real = []
    model = None
    for name, path in profiles.items():
        prof = parquet_io.read_profile(path)
        model = prof.model
        for t, share in prof.operating_points():
            cr, sr = _ratios(prof.resolve(t, share))
            out.append({"setting": name, "cpu_threads": t, "cpu_over_gpu": cr, "copy_over_gpu": sr})
    for g in GPUS:
        for lk in LINKS:
            for c in CPUS:
                spec = platform_spec(g, link=lk, cpu=c)
                threads = sorted({1, 2, 4, 8, 16, CPUS[c].cores})
                ap = analytic_profile(model, spec, threads, gpu_shares=(100,))
                for t in threads:
                    cr, sr = _ratios(ap.resolve(t, 100.0))
                    real.append((f"{g}+{lk}+{c}, {t} threads", cr, sr))
    for row in out:
        best = min(real, key=lambda r: abs(math.log(r[1] / row["cpu_over_gpu"]))
                   + abs(math.log(r[2] / row["copy_over_gpu"])))
        row.update(nearest=best[0], nearest_cpu_over_gpu=best[1], nearest_copy_over_gpu=best[2])
    return out


def resemblance_table(rows: list[dict]) -> str:
    lines = ["| setting | threads | CPU expert / accelerator expert | copy / accelerator expert | "
             "nearest catalog platform (analytic) | its ratios |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['cpu_threads']} | {r['cpu_over_gpu']:.2f} | "
                     f"{r['copy_over_gpu']:.2f} | {r['nearest']} | "
                     f"{r['nearest_cpu_over_gpu']:.2f}, {r['nearest_copy_over_gpu']:.2f} |")
    return "\n".join(lines)


def contention_rows(profiles: dict[str, Path]) -> list[dict]:
    """Per grid setting and CPU-thread count: where its measured schedules depart most from the
    composition of their isolated ops (``cope contention``), and how much of a prefetch copy a
    running layer hides."""
    from cope_core import parquet_io
    from cope_core.estimate.contention import contention, prefetch_hiding
    from cope_core.files import plain
    out = []
    for name, path in profiles.items():
        prof = parquet_io.read_profile(path)
        for t, share in prof.operating_points():
            df = contention(prof, t, share)
            hi, lo = df.loc[df["excess_pct"].idxmax()], df.loc[df["excess_pct"].idxmin()]
            pf = prefetch_hiding(prof, t, share)
            out.append({"setting": name, "cpu_threads": t,
                        "largest_excess": plain(hi.to_dict()),
                        "largest_shortfall": plain(lo.to_dict()),
                        "contention_rows": int((df["verdict"] == "contention").sum()),
                        "faster_rows": int((df["verdict"] == "faster").sum()),
                        "rows": len(df),
                        "prefetch_hidden_pct": float(pf["hidden_pct"].mean()),
                        "prefetch_isolated_us": float(pf["isolated_us"].iloc[0])})
    return out


def bias_rows(trace: Path, cal: Path, settings: dict[str, tuple[Path, Path]]) -> list[dict]:
    """Per grid setting and CPU-thread count: each estimator's mean signed error (predicted
    over measured TPOT, %) on the candidates of each residency. A ranking goes wrong where these
    differ between residencies, whatever their common level."""
    import warnings

    from cope_core import parquet_io
    from cope_core.estimate.evaluate import evaluation_pairs
    tr, c = parquet_io.read_trace(trace), parquet_io.read_trace(cal)
    out: list[dict] = []
    for name, (prof, meas) in settings.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pairs = evaluation_pairs(tr, parquet_io.read_profile(prof),
                                     parquet_io.read_measurements(meas), c,
                                     estimators=("cope", "atomic"), draws=0)
        for est, df in pairs.items():
            df = df.assign(residency=df["candidate"].str.split("/").str[0])
            per = df.groupby(["cpu_threads", "residency", "candidate"])[
                ["predicted_us", "measured_us"]].mean()
            per["err"] = 100.0 * (per["predicted_us"] / per["measured_us"] - 1.0)
            for t, grp in per.groupby(level="cpu_threads"):
                by = grp.groupby(level="residency")["err"].mean()
                err = {c: float(v) for (_, _, c), v in grp["err"].items()}
                out.append({"setting": name, "cpu_threads": int(t), "estimator": est,
                            **{r: float(v) for r, v in by.items()},
                            "gap": residency_gaps(err)})
    order = {n: i for i, n in enumerate(settings)}
    return sorted(out, key=lambda r: (order[r["setting"]], r["cpu_threads"],
                                      r["estimator"] != "cope"))


def ablation_rows(trace: Path, cal: Path, settings: dict[str, tuple[Path, Path]]) -> list[dict]:
    """COPE on each setting's own profile with its prefetch rows beside CPU misses dropped, so
    every prefetch is priced beside a resident layer (as before those rows existed): per cell
    its pick and regret, against the same measurements, with ``cope evaluate``'s defaults."""
    import dataclasses
    import warnings

    from cope_core import parquet_io
    from cope_core.estimate.evaluate import evaluate
    tr, c = parquet_io.read_trace(trace), parquet_io.read_trace(cal)
    out: list[dict] = []
    for name, (prof_path, meas) in settings.items():
        prof = parquet_io.read_profile(prof_path)
        t = prof.table
        keep = ~((t["kind"] == "prefetch") & (t["cpu"] != -1))
        if keep.all():
            continue                      # a profile made before the rows: nothing to drop
        resident = dataclasses.replace(prof, table=t[keep].reset_index(drop=True))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ev = evaluate(tr, resident, parquet_io.read_measurements(meas), c,
                          estimators=("cope",))["cope"].to_dict(True)
        for cell in ev["per_k"]:
            out.append({"setting": name, "K": cell["K"], "cpu_threads": cell["cpu_threads"],
                        "pick": cell["predicted"], "agree": cell["agree"],
                        "within_noise": cell["within_noise"],
                        "regret_pct": cell["regret_pct"], "mape_pct": cell["mape_pct"]})
    return out


def ablation_table(rows: list[dict], cells: list[dict]) -> str:
    """The ablation's cells beside COPE's own, and both aggregates."""
    if not rows:
        return ""
    own = {(tag(c["link_gbps"], c["cpu_slowdown"]), c["K"], c["cpu_threads"]): c["cope"]
           for c in cells if c.get("cope")}
    lines = ["COPE with every prefetch priced beside a resident layer (each profile's rows beside "
             "CPU misses dropped) against COPE as shipped, on the same measurements:", "",
             "| setting | threads | K | beside CPU misses: pick (regret, MAPE) | beside a resident "
             "layer only: pick (regret, MAPE) |", "|---|---|---|---|---|"]
    for r in rows:
        o = own.get((r["setting"], r["K"], r["cpu_threads"]))
        mine = (f"{o['pick']} ({o['regret_pct']:.1f} %, {o['mape_pct']:.1f} %)" if o else "—")
        lines.append(f"| {r['setting']} | {r['cpu_threads']} | {r['K']} | {mine} | "
                     f"{r['pick']} ({r['regret_pct']:.1f} %, {r['mape_pct']:.1f} %) |")
    mine = [own[k] for k in ((r["setting"], r["K"], r["cpu_threads"]) for r in rows) if k in own]

    def agg(xs: list[dict]) -> str:
        n = len(xs)
        return (f"tie-aware {sum(x['within_noise'] for x in xs)}/{n}, strict "
                f"{sum(x['agree'] for x in xs)}/{n}, mean regret "
                f"{sum(x['regret_pct'] for x in xs) / n:.2f} %, max "
                f"{max(x['regret_pct'] for x in xs):.2f} %, MAPE "
                f"{sum(x['mape_pct'] for x in xs) / n:.2f} %")
    lines += ["", f"Beside CPU misses: {agg(mine)}. Beside a resident layer only: {agg(rows)}."]
    return "\n".join(lines)


EXECS = ("parallel", "wait_then_gpu", "ready_first", "cost_selected")
MUTABLE = ("mutable_per_layer", "mutable_cross_layer")


def residency_gaps(err: dict[str, float]) -> dict[str, float]:
    """Per execution: the mutable residencies' mean signed error (``err`` by candidate id, %)
    minus the fixed residency's with the same execution, in points. Negative: the estimator
    prices the mutable residency too cheap against fixed, which is how it comes to pick a
    mutable candidate where fixed wins."""
    out: dict[str, float] = {}
    for e in EXECS:
        mut = [err[f"{r}/{e}"] for r in MUTABLE if f"{r}/{e}" in err]
        if mut and f"fixed/{e}" in err:
            out[e] = sum(mut) / len(mut) - err[f"fixed/{e}"]
    return out


def gap_table(rows: list[dict]) -> str:
    lines = ["Residency gap by execution: the mutable residencies' mean signed error minus the "
             "fixed residency's, same execution, in points (negative: mutable priced too cheap "
             "against fixed):", "",
             "| setting | threads | estimator | " + " | ".join(EXECS) + " |",
             "|---|---|---|" + "---|" * len(EXECS)]
    for r in rows:
        gap = r.get("gap", {})
        lines.append(f"| {r['setting']} | {r['cpu_threads']} | {r['estimator']} | "
                     + " | ".join(f"{gap[e]:+.1f}" if e in gap else "—" for e in EXECS)
                     + " |")
    return "\n".join(lines)


def bias_table(rows: list[dict]) -> str:
    res = ["fixed", "mutable_per_layer", "mutable_cross_layer", "layer_partition"]
    lines = ["Mean signed error (predicted over measured TPOT) of each estimator on the "
             "candidates of each residency:", "",
             "| setting | threads | estimator | " + " | ".join(res) + " |",
             "|---|---|---|" + "---|" * len(res)]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['cpu_threads']} | {r['estimator']} | "
                     + " | ".join(f"{r[x]:+.1f} %" if x in r else "—" for x in res) + " |")
    return "\n".join(lines)


def contention_table(rows: list[dict]) -> str:
    def row(r: dict) -> str:
        return (f"{r['execution']} h={r['hits']} c={r['cpu']} u={r['staged']}: "
                f"{r['excess_pct']:+.1f} % ({r['measured_us'] / 1e3:.1f} vs "
                f"{r['composed_us'] / 1e3:.1f} ms)")
    lines = ["Measured schedules against the composition of their isolated ops "
             "(`cope contention`; the composition is what the atomic simulation charges):", "",
             "| setting | threads | most above its composition (contention) | most below it "
             "(better overlap) | rows beyond noise: slower / faster | prefetch hidden by a layer |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['cpu_threads']} | {row(r['largest_excess'])} | "
                     f"{row(r['largest_shortfall'])} | {r['contention_rows']} / "
                     f"{r['faster_rows']} of {r['rows']} | {r['prefetch_hidden_pct']:.0f} % of "
                     f"{r['prefetch_isolated_us'] / 1e3:.1f} ms |")
    return "\n".join(lines)


def report(cells: list[dict], top1_prompts: dict[str, list[int]] | None = None) -> str:
    lines = ["| link | host | threads | K | measured winner | margin | beyond noise | COPE | "
             "atomic | HRM |", "|---|---|---|---|---|---|---|---|---|---|"]
    def pick(c: dict, est: str) -> str:
        e = c.get(est)
        if e is None:
            return "—"
        mark = "=" if e["agree"] else "~" if e["within_noise"] else "✗"
        return f"{mark} {e['pick']} (regret {e['regret_pct']:.1f} %, MAPE {e['mape_pct']:.1f} %)"
    for c in cells:
        link = "unpaced" if c["link_gbps"] is None else f"{c['link_gbps']:g} GB/s"
        lines.append(f"| {link} | {c['cpu_slowdown']:g}x slower | {c['cpu_threads']} | {c['K']} | "
                     f"{c['measured']} | {c['margin_pct']:.1f} % over {c['runner_up']} | "
                     f"{'yes' if not c['tied'] else 'no: ' + ', '.join(c['tied'])} | "
                     f"{pick(c, 'cope')} | {pick(c, 'atomic')} | {pick(c, 'hrm')} |")
    lines += ["", "| estimator | tie-aware top-1 (cells) | strict top-1 (cells) | strict top-1 "
              "(prompts) | mean regret | max regret | mean MAPE |",
              "|---|---|---|---|---|---|---|"]
    n = len(cells)
    for est in ESTIMATORS:
        es = [c[est] for c in cells if c.get(est)]
        if not es:
            continue
        tp = (top1_prompts or {}).get(est)
        lines.append(f"| {est} | {sum(e['within_noise'] for e in es)}/{n} | "
                     f"{sum(e['agree'] for e in es)}/{n} | "
                     f"{'—' if tp is None else f'{tp[0]}/{tp[1]}'} | "
                     f"{sum(e['regret_pct'] for e in es) / len(es):.2f} % | "
                     f"{max(e['regret_pct'] for e in es):.2f} % | "
                     f"{sum(e['mape_pct'] for e in es) / len(es):.2f} % |")
    winners = sorted({c["measured"] for c in cells})
    beyond = sum(not c["tied"] for c in cells)
    lines += ["", f"{len(winners)} distinct measured winners ({', '.join(winners)}); the winner "
              f"is beyond the tie test in {beyond} of {n} cells."]
    return "\n".join(lines)
