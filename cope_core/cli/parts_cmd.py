"""``cope parts``: the parts catalog (:mod:`cope_core.parts`), this machine, and a machine
composed from parts (:func:`cope_core.machine.compose_machine`) with every number said to be
from the catalog, derived, detected, measured or assumed."""
from __future__ import annotations

import argparse

from ..files import print_json
from ..machine import THIS
from ..parts.catalog import memory_types
from ..parts.tables import LISTS, format_rows, rows
from .args import add_machine_options, add_probe_option, machine_from_args

WHAT = (*LISTS, "this", "machine")


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("parts", help="list the parts catalog (GPUs, CPUs, memory, links), show "
                                     "this machine, or compose one from parts")
    s.add_argument("what", nargs="?", default="gpus", choices=WHAT,
                   help="gpus, cpus, memory, links (the catalog; default gpus), this (detect "
                        "and probe this machine) or machine (compose one from --gpu, --cpu, "
                        "--memory, --pcie)")
    s.add_argument("--search", metavar="TEXT", default="",
                   help="only parts whose name or label contains TEXT (e.g. 4060, ryzen 7)")
    s.add_argument("--sources", action="store_true", help="print each part's source too")
    add_machine_options(s, prefix="machine: ", notes={"cpu": " (default this)"})
    add_probe_option(s)
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=cmd_parts)


def cmd_parts(args: argparse.Namespace) -> int:
    if args.what in LISTS:
        table = rows(LISTS[args.what], args.search)
        if args.json:
            print_json(table if args.what != "memory" else
                       {"types": list(memory_types().values()), "names": table})
            return 0
        if args.what == "memory":
            print("memory names are TYPE-MTSxCHANNELS: peak = MT/s x 8 bytes x channels; types: "
                  + ", ".join(f"{n} ({r['min_mts']}-{r['max_mts']} MT/s)"
                              for n, r in memory_types().items()))
            print("the catalog CPUs' usual memory:")
        print(format_rows(table))
        if args.sources:
            print("\nsources:")
            for r in table:
                print(f"  {r['name']}: {r['source']}" + (f" ({r['note']})" if r["note"] else ""))
        return 0
    if args.what == "this":
        m = machine_from_args(args, gpu=THIS, cpu=THIS, memory=args.memory or THIS)
    else:
        m = machine_from_args(args, cpu=args.cpu or THIS)
    if args.json:
        print_json(m.to_dict())
        return 0
    head = (f"{m.cpu.label}, {m.memory.name}, {m.threads} threads, CPU-only (no GPU)"
            if m.cpu_only else " + ".join(f"{g.label} on {lk.name}" for g, lk in m.cards)
            + f", {m.cpu.label}, {m.memory.name}, {m.threads} threads")
    print(head)
    print(m.describe())
    return 0
