r"""The export formats: one record each, and the one function that renders by name.

Everything that lists the formats reads :data:`EXPORT_FORMATS`: ``cope export --format``'s
choices and help, the app's Export tabs, the table at the top of docs/export.md
(:func:`markdown_table`, written by ``scripts/export_examples.py``) and the tests that loop over
formats. A new format is one record here plus its renderer module, whose docstring cites the
runtime's source (repository, commit or version, paths) that the record's ``version`` names.

``json`` is COPE's own ``cope.policy/1`` record, from which every runtime format renders again.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CopeInputError
from ..llamacpp import LlamaFlags
from .cache_runtimes import render_fastllm, render_freetoken
from .common import Rendered
from .exllamav3 import DEFAULT_STATS, render_exllamav3
from .ik_llamacpp import render_ik_llamacpp
from .ktransformers import render_ktransformers
from .llamacpp import lead_line, render_llamacpp
from .policy import Policy, policy_json
from .sglang_kt import DEFAULT_PT, render_sglang_kt
from .vllm import render_vllm


@dataclass(frozen=True)
class SideFile:
    """A file a format writes beside its text, which the text names by path.

    Attributes
    ----------
    suffix : str
        Its name is a stem and this suffix (:meth:`path`): ``cope export -o OUT`` writes it to
        OUT with its suffix replaced by this one, the app's download is
        ``MODEL-CANDIDATE-K<K>`` + this suffix.
    what : str
        What it holds, for messages (``tensor``).
    option : str
        The keyword argument of :func:`render` that gives the renderer its path (one of the
        format's ``options``).
    """

    suffix: str
    what: str
    option: str

    def path(self, stem: str) -> str:
        """Its path beside ``stem``: ``stem`` + :attr:`suffix`."""
        return stem + self.suffix

    def stem_of(self, out: str) -> str:
        """The stem of ``cope export -o OUT``: OUT less :attr:`suffix` when it ends with it (the
        file itself was asked for), else OUT less its own suffix (``run.sh`` -> ``run``)."""
        if out.endswith(self.suffix):
            return out[:-len(self.suffix)]
        return str(Path(out).with_suffix(""))


@dataclass(frozen=True)
class ExportFormat:
    """One export format.

    Attributes
    ----------
    name : str
        The ``--format`` value.
    label : str
        How people name it (the app's tab, "LABEL runs exactly ...").
    runtime, version : str
        The runtime, and the release or commit of its source the renderer was written against
        (the renderer module's docstring cites it, with the paths read; docs/export.md has the
        full list).
    help : str
        One line for ``cope export --help``.
    takes, exact, otherwise : str
        docs/export.md's cells (Markdown): what the runtime takes, which candidates it runs
        exactly, and what it runs instead of the others.
    render : callable
        ``render(policy, *options) -> Rendered``.
    options : tuple of str
        Which of :func:`render`'s keyword arguments the renderer takes after the policy, in order.
    language : str
        What the text is (``json``, ``bash``, ``yaml``): the app's highlighting and the download's
        MIME type (:attr:`mime`).
    suffix : str
        File-name suffix of the text when downloaded (``MODEL-CANDIDATE-K<K>`` + suffix); empty
        for ``.NAME.sh`` (see :attr:`file_suffix`).
    side_file : SideFile or None
        The file the format writes beside its text, if any (``cope export`` then needs ``-o``);
        :meth:`side_options` names it for :func:`render`.
    lead : callable or None
        ``lead(policy) -> str or None``: a sentence the answer leads with, shown above the
        command (llama.cpp: its default, ``--fit``, against its best configuration); None, or
        a None answer: no such sentence.
    own_record : bool
        COPE's own record, not a runtime's form (``json``): the app shows it last, and with
        ``caption`` instead of whether a runtime runs the candidate exactly.
    caption : str
        What the app says under the text in place of whether the runtime runs the candidate
        exactly (Markdown; empty: it says that).
    advised : bool
        ``cope advise`` answers for this runtime (:mod:`cope_core.export.advising`).
    default : str
        For ``cope advise``: what the runtime does with no placement flag, in words.
    default_kind : str
        ``fit`` (llama.cpp's ``--fit`` places the model), ``gpu`` (every expert on the GPU: it
        loads only when the whole model fits; ik_llama.cpp and SGLang-KT as read in their
        renderer modules' sources) or ``unknown`` (not read from its source).
    cpu_only : bool
        Runs on a machine without a GPU (every weight on the CPU).
    context_flag : str
        The flag that sets the context (the KV cache's tokens), when read from the runtime's
        source: ``-c`` (``--ctx-size``, llama.cpp's ``common/arg.cpp``); empty when not read.
    """

    name: str
    label: str
    runtime: str
    version: str
    help: str
    takes: str
    exact: str
    otherwise: str
    render: Callable[..., Rendered]
    options: tuple[str, ...] = ()
    language: str = "bash"
    suffix: str = ""
    side_file: SideFile | None = None
    lead: Callable[[Policy], str | None] | None = None
    own_record: bool = False
    caption: str = ""
    advised: bool = False
    default: str = "not read from its source"
    default_kind: str = "unknown"
    cpu_only: bool = False
    context_flag: str = ""

    @property
    def module(self) -> str:
        """The module that renders it (its docstring cites the runtime's source)."""
        return self.render.__module__

    @property
    def mime(self) -> str:
        """MIME type of the text, for a download."""
        return _MIME[self.language]

    @property
    def read_in(self) -> str:
        """``RUNTIME, VERSION``: what the renderer was written against."""
        return f"{self.runtime}, {self.version}"

    @property
    def file_suffix(self) -> str:
        """``suffix``, or ``.NAME.sh`` for a shell line."""
        return self.suffix or f".{self.name}.sh"

    def side_options(self, stem: str) -> dict[str, Any]:
        """The keyword arguments of :func:`render` that name the side file ``stem`` + its
        suffix (:meth:`SideFile.path`); empty for a format without one. The app's Export page
        (stem ``MODEL-CANDIDATE-K<K>``) and ``cope export -o OUT`` (stem
        :meth:`SideFile.stem_of` OUT) both call it, so the file the flags name is the one
        downloaded or written. (Typed ``Any`` as :func:`render`'s other keyword arguments are
        not strings: ``render(policy, name, **side_options(stem))``.)"""
        if self.side_file is None:
            return {}
        return {self.side_file.option: self.side_file.path(stem)}


def render_json(policy: Policy) -> Rendered:
    """The ``cope.policy/1`` record itself."""
    return Rendered("json", policy_json(policy))


_MIME = {"json": "application/json", "bash": "text/x-shellscript", "yaml": "application/yaml"}
_SAME_VRAM = "`layer_partition` at the same VRAM"

#: Every export format, in the order the CLI, the app and the docs show them.
EXPORT_FORMATS: tuple[ExportFormat, ...] = (
    ExportFormat(
        "json", "JSON (cope.policy/1)", "COPE's own record", "cope.policy/1",
        "the cope.policy/1 record; every format renders from it again (--from-policy)",
        "the `cope.policy/1` record", "every candidate", "-",
        render_json, language="json", suffix=".policy.json", own_record=True,
        caption="The policy record: every runtime format renders from it again (`cope export "
                "--from-policy FILE --format ...`)."),
    ExportFormat(
        "llama.cpp", "llama.cpp", "llama.cpp", "b11434; its MoE cache flags b11480 to b12191",
        "mainline llama-server flags: --n-cpu-moe N, its own MoE cache (--moe-cache-mib), -ot",
        "leads with the fastest configuration llama.cpp itself can run at the VRAM: `-ngl 99 "
        "-fit off --n-cpu-moe N [--moe-cache-mib M [--moe-cache-cpu-share F]]` (its own MoE "
        "cache, [below](#llamacpps-own-moe-cache)); then the layer partition at K, `-ngl 99 -fit "
        "off --n-cpu-moe N`, or the same with `-ot 'REGEX=CPU'`",
        "`layer_partition`, and its own cache candidates `llamacpp_cache/lru`, "
        "`llamacpp_cache/classlru`", _SAME_VRAM, render_llamacpp, lead=lead_line,
        advised=True, default="--fit (no placement flags)", default_kind="fit", cpu_only=True,
        context_flag="-c"),
    ExportFormat(
        "ik_llama.cpp", "ik_llama.cpp", "ik_llama.cpp", "8337e4cd3861 (2026-08-15)",
        "ik_llama.cpp flags: -ot of the first MoE layers, or its -ncmoe N (the last N)",
        f"`-ngl 999 -t T -ot '{LlamaFlags.expert_override('(...)', 'ik_llama.cpp')}=CPU'` "
        "(the first MoE layers, exactly), or its own `-ncmoe N` (the **last** N MoE layers, at "
        "the N that fits the same VRAM); no `-fit`",
        "`layer_partition`", _SAME_VRAM, render_ik_llamacpp, advised=True,
        default="without -ngl/-ot/-ncmoe every expert on the GPU (-ngl 999 with a GPU; --fit "
                "is off by default)", default_kind="gpu", cpu_only=True,
        context_flag="-c"),
    ExportFormat(
        "exllamav3", "exllamav3", "exllamav3", "1.6.5, the PyPI wheel",
        "exllamav3 -mcs E-K with an expert-statistics file (-o OUT: the .json), or -mcl N",
        "`EXL3_MOE_CPU_SWAP=0 EXL3_MOE_CPU_SPLIT_STATS=OUT.json python examples/chat.py -m "
        "MODEL_DIR -mct T -mcs E-K` (the stats file ranks each layer's K resident experts "
        "first), or `-mcl N` for whole layers; `--exl3-bits` sizes the experts in its own bits "
        "per weight",
        "`fixed/parallel`, `layer_partition` (and any fixed candidate at K = E)",
        "`fixed/parallel` with the same resident experts",
        render_exllamav3, options=("stats_path", "exl3_bits"),
        side_file=SideFile(".json", "expert-statistics", "stats_path"), advised=True,
        default="without -mcs/-mcl every expert on the GPU", default_kind="gpu"),
    ExportFormat(
        "ktransformers", "KTransformers", "legacy KTransformers (<= 0.4.1)", "95009ea6856c",
        "optimize-rule YAML of legacy KTransformers (<= 0.4.1)",
        "optimize-rule YAML for the `model.layers.N.mlp.experts` modules",
        "`layer_partition`", _SAME_VRAM, render_ktransformers, language="yaml",
        suffix=".ktransformers.yaml"),
    ExportFormat(
        "sglang-kt", "SGLang-KT", "SGLang-KT (kvcache-ai/sglang)", "0.7.2, the PyPI wheel",
        "SGLang-KT --kt-* flags and its expert-location tensor (-o OUT: the .pt)",
        "`--kt-method M --kt-num-gpu-experts K --kt-expert-placement-strategy frequency "
        "--init-expert-location FILE.pt`, M the kt-kernel kernel the profile priced (`BF16` for "
        "16-bit experts, `LLAMAFILE` for GGUF ones, `MXFP4`) instead of the default `AMXINT4`",
        "`fixed/parallel`, `layer_partition`", "`fixed/parallel` with the same resident experts",
        render_sglang_kt, options=("pt_path", "with_files"),
        side_file=SideFile(".pt", "tensor", "pt_path"),
        advised=True, default="without --kt-num-gpu-experts/--kt-gpu-experts-ratio no KT "
                              "offload: every expert on the GPU", default_kind="gpu"),
    ExportFormat(
        "vllm", "vLLM", "vLLM", "0.33.0; the flags from 0.17.0",
        "vLLM weight offloading (--cpu-offload-gb): exact only at K = E",
        "`--offload-backend uva --cpu-offload-gb G --cpu-offload-params experts`",
        "nothing (only at K = E)", "a setting outside the Policy Matrix", render_vllm,
        advised=True, default="without --cpu-offload-gb every expert on the GPU",
        default_kind="gpu"),
    ExportFormat(
        "freetoken", "FreeToken", "FreeToken", "0.2.1, the PyPI wheel",
        "FreeToken ft serve --moe-strategy, with its LRU slot cache",
        "`ft serve --model MODEL --moe-strategy fused` (every expert on the GPU), `cpu` (every "
        "expert on the CPU), else `offload` or `hybrid` with `--moe-cache-size K·L "
        "--moe-cache-scope unified --moe-cache-policy lru`",
        "fixed residency at K = E, `fixed/parallel` at K = 0",
        "its demand-filled LRU slot cache at the same VRAM: outside the Policy Matrix",
        render_freetoken),
    ExportFormat(
        "fastllm", "fastllm", "fastllm (PyPI: ftllm)", "1.9.0, the PyPI wheel",
        "fastllm ftllm server --moe_device / --moe_device_layers N / --moe_cuda_cache",
        "`ftllm server MODEL --device cuda -t T` plus `--moe_device cpu` (every expert on the "
        "CPU), `--moe_device_layers N` (the **last** N MoE layers), else `--moe_cuda_cache SIZE`",
        "fixed residency at K = E, `fixed/parallel` at K = 0, `layer_partition` (its last N "
        "layers, at the N that fits the same VRAM)",
        "its heat-driven expert cache at the same VRAM: outside the Policy Matrix",
        render_fastllm),
)
#: The ``--format`` names, in order.
FORMATS: tuple[str, ...] = tuple(f.name for f in EXPORT_FORMATS)
_BY_NAME = {f.name: f for f in EXPORT_FORMATS}


def get_format(name: str) -> ExportFormat:
    """The record of format ``name``; :class:`CopeInputError` naming the formats if none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise CopeInputError(f"unknown format {name!r}; expected one of {list(FORMATS)}",
                             field="format") from None


def render(policy: Policy, fmt: str, *, strict: bool = False,
           pt_path: str = DEFAULT_PT, stats_path: str = DEFAULT_STATS,
           exl3_bits: float | None = None, with_files: bool = True) -> Rendered:
    """Render ``policy`` for one runtime.

    Parameters
    ----------
    policy : Policy
    fmt : str
        One of :data:`FORMATS`.
    strict : bool
        Raise :class:`CopeInputError` when the runtime cannot run exactly the chosen candidate,
        instead of rendering the nearest policy it can run.
    pt_path : str
        For ``sglang-kt``: the path the flags give for the expert-location tensor (its bytes are
        in ``Rendered.files`` under that name).
    stats_path, exl3_bits : str, float
        For ``exllamav3``: the path of the expert-statistics JSON the environment names (in
        ``Rendered.files``), and the model's bits per weight for its memory note (None: not
        sized).
    with_files : bool
        False: SGLang-KT's expert-location tensor is not made (its text alone, without torch:
        ``cope advise`` makes it only when asked to write it); the other formats ignore it.

    Returns
    -------
    Rendered
        ``exact`` False means the text deploys ``deployed`` (or, for vLLM, a setting outside
        the Policy Matrix) and ``summary`` says what the runtime cannot express.
    """
    spec = get_format(fmt)
    given = {"pt_path": pt_path, "stats_path": stats_path, "exl3_bits": exl3_bits,
             "with_files": with_files}
    out = spec.render(policy, *(given[o] for o in spec.options))
    if strict and not out.exact:
        raise CopeInputError(f"{out.summary} (--strict)", field="format")
    return out


def _cell(text: str) -> str:
    return text.replace("|", r"\|")      # a bar inside a code span still ends a GFM cell


def markdown_table() -> str:
    """docs/export.md's table of formats (what ``scripts/export_examples.py`` writes there)."""
    lines = ["| format | runtime, as read | what the runtime takes | runs exactly | "
             "otherwise it runs |", "|---|---|---|---|---|"]
    lines += [f"| `{f.name}` | {_cell(f.read_in)} | {_cell(f.takes)} | "
              f"{_cell(f.exact)} | {_cell(f.otherwise)} |" for f in EXPORT_FORMATS]
    return "\n".join(lines) + "\n"


def epilog() -> str:
    """``cope export --help``'s list of formats: name, help line, runtime and version read."""
    width = max(len(f.name) for f in EXPORT_FORMATS) + 2
    return "formats:\n" + "".join(
        f"  {f.name:<{width}}{f.help}\n  {'':<{width}}read in: {f.read_in}\n"
        for f in EXPORT_FORMATS)
