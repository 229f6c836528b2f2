"""A replay of ik_llama.cpp's own parsing and placement, for the tests of the command lines
written for it (ikawrakow/ik_llama.cpp @ 8337e4cd3861406fc04e0854b1409cd1b027fbc9; it is not on
a package registry and is not built here): ``common/common.cpp`` ``gpt_params_find_arg`` for the
flags the exports use, an unknown argument being an error, and ``src/llama-load-tensors.cpp``'s
overrides (user ``-ot`` first, then ``-ncmoe``'s last N blocks that hold experts;
``std::regex_search``, the first match wins)."""
from __future__ import annotations

import re
import shlex


class UnknownArgument(Exception):
    pass


def ik_place(line: str, names: list[str]) -> set[str]:
    """The tensors an ik_llama.cpp command line puts on the CPU (one GPU)."""
    argv = shlex.split(line)[1:]
    overrides, ncmoe, fit, i = [], 0, False, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            a = a.replace("_", "-")
        if a in ("-m", "-ngl", "-t"):
            i += 2
            continue
        if a in ("-ot", "--override-tensor"):
            for item in argv[i + 1].split(","):      # parse_buft_overrides: commas, then '='
                pattern, _, target = item.partition("=")
                overrides.append((pattern, target))
            i += 2
            continue
        if a in ("-ncmoe", "--n-cpu-moe"):
            ncmoe = int(argv[i + 1])
            i += 2
            continue
        if a in ("-cmoe", "--cpu-moe"):
            ncmoe = 999
            i += 1
            continue
        if a == "--fit":
            fit = True
            i += 1
            continue
        raise UnknownArgument(f"error: unknown argument: {a}")
    if fit and (ncmoe or overrides):
        raise ValueError("--fit refuses -ncmoe and -ot")
    blocks = sorted({int(n.split(".")[1]) for n in names
                     if re.fullmatch(r"blk\.\d+\.ffn_down_exps\.weight", n)}, reverse=True)
    for b in blocks[:ncmoe]:                         # the last N blocks holding experts
        overrides.append((rf"blk\.{b}\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)", "CPU"))
    placed = set()
    for n in names:
        for pattern, target in overrides:
            if re.search(pattern, n):
                if target == "CPU":
                    placed.add(n)
                break
    return placed
