"""docs/formats.md against the code: every column, key and tensor the code writes is documented.

Files are written by the library itself (tiny fixtures), and what lands in them is compared with
the tables of the matching section of the page, so adding a column or a metadata key without
documenting it fails here, as does documenting one the code no longer writes.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from tiny import tiny_geometry, tiny_measurements, tiny_profile, tiny_trace

from cope_core import get_model, parquet_io
from cope_core.geometry import ModelGeometry
from cope_core.platforms import PlatformSpec
from cope_core.profile.data import SHARED_PARTS, required_keys

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "formats.md").read_text(encoding="utf-8")

PARQUET = {
    parquet_io.TRACE_SCHEMA: (parquet_io.TRACE_COLUMNS, parquet_io.write_trace,
                              parquet_io.read_trace, tiny_trace),
    parquet_io.PROFILE_SCHEMA: (parquet_io.PROFILE_COLUMNS, parquet_io.write_profile,
                                parquet_io.read_profile, tiny_profile),
    parquet_io.MEASUREMENTS_SCHEMA: (parquet_io.MEASUREMENT_COLUMNS, parquet_io.write_measurements,
                                     parquet_io.read_measurements, tiny_measurements),
}
#: Arrow's names for the types the contract calls float32/float64.
_ARROW_NAMES = {"float": "float32", "double": "float64"}


# --- reading the page ---------------------------------------------------------------------------
def section(text: str, level: int, title: str) -> str:
    """The body under the one heading of ``level`` whose title contains ``title``."""
    marks = "#" * level
    heads = [m for m in re.finditer(rf"^{marks} (.+)$", text, re.M) if title in m.group(1)]
    assert len(heads) == 1, f"expected one '{marks} ...{title}...' heading, found {len(heads)}"
    rest = text[heads[0].end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[:end.start()] if end else rest


def rows(block: str) -> list[list[str]]:
    """Cells of the first Markdown table in ``block``, header and separator left out."""
    lines = block.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return table[2:]


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def table(schema_title: str, sub: str) -> dict[str, list[str]]:
    """First-cell name -> cells, for the table under ``## ...schema_title`` / ``### sub``."""
    out: dict[str, list[str]] = {}
    for cells in rows(section(section(DOC, 2, schema_title), 3, sub)):
        for name in names(cells[0]):
            assert name not in out, f"{name} documented twice under {schema_title} / {sub}"
            out[name] = cells
    return out


def fenced(block: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", block, re.M | re.S)


# --- files written by the code ------------------------------------------------------------------
@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder with one file of every format, under the names the page's examples use."""
    from cope_core.export import build_policy, render, write_policy
    from cope_core.trace.sources.hidden import HiddenStateWriter, read_hidden_states
    from cope_core.trace.sources.predictor import train_predictor
    d = tmp_path_factory.mktemp("formats")
    files = {"trace.parquet": parquet_io.TRACE_SCHEMA, "profile.parquet": parquet_io.PROFILE_SCHEMA,
             "measured.parquet": parquet_io.MEASUREMENTS_SCHEMA}
    for name, schema in files.items():
        _, write, _, make = PARQUET[schema]
        write(make(), d / name)
    trace, profile = parquet_io.read_trace(d / "trace.parquet"), parquet_io.read_profile(
        d / "profile.parquet")
    policy = build_policy(trace, profile, trace, experts_per_layer=2)
    write_policy(policy, d / "policy.json")
    (pt, data), = render(policy, "sglang-kt", pt_path=str(d / "experts.pt")).files
    Path(pt).write_bytes(data)
    g, rng = tiny_geometry(), np.random.default_rng(0)
    with HiddenStateWriter(d / "run.hidden", g, chunk=5, dtype="float32") as w:
        for p in range(3):
            for t in range(4):
                routed = np.stack([rng.permutation(g.n_experts)[:g.top_k]
                                   for _ in range(g.n_layers)])
                w.add(p, t, rng.normal(size=(g.n_layers, 8)), routed)
    pred, _ = train_predictor(read_hidden_states(d / "run.hidden"), epochs=1, seed=0)
    pred.save(d / "predictor.safetensors")
    from cope_core.verify import VerifyCell, VerifyRecord, write_verify
    cell = VerifyCell(K=2, cpu_threads=8, gpu_share=100.0, predicted_winner="fixed/parallel",
                      contenders=[], dropped=[], remaining=["fixed/parallel"],
                      verified_winner="fixed/parallel", measured_us=100.0, measured_lo_us=99.0,
                      measured_hi_us=101.0, stop="one left", rounds=2, candidate_trials=4,
                      full_candidate_trials=39, seconds=1.0, full_seconds_estimate=9.0)
    write_verify(VerifyRecord(model=g, platform={}, inputs={}, settings={}, cells=[cell]),
                 d / "verify.json")
    return d


def _path(work: Path, schema: str) -> Path:
    return work / {parquet_io.TRACE_SCHEMA: "trace.parquet",
                   parquet_io.PROFILE_SCHEMA: "profile.parquet",
                   parquet_io.MEASUREMENTS_SCHEMA: "measured.parquet"}[schema]


# --- Parquet schemas ----------------------------------------------------------------------------
@pytest.mark.parametrize("schema", list(PARQUET))
def test_every_written_column_is_documented_with_its_type(schema, work):
    spec = PARQUET[schema][0]
    written = pq.read_schema(_path(work, schema))
    assert written.names == list(spec)
    doc = table(f"`{schema}`", "Columns")
    assert list(doc) == written.names  # same columns, in file order
    for field in written:
        arrow = str(field.type).replace("element: ", "")
        assert doc[field.name][1] == f"`{_ARROW_NAMES.get(arrow, arrow)}`", field.name


@pytest.mark.parametrize("schema", list(PARQUET))
def test_every_written_metadata_key_is_documented(schema, work):
    meta = parquet_io.read_metadata(_path(work, schema))
    doc = table(f"`{schema}`", "Metadata")
    assert sorted(doc) == sorted(meta)
    assert f'`"{schema}"`' in doc["schema"][3]


@pytest.mark.parametrize("schema", list(PARQUET))
def test_documented_required_keys_are_the_ones_the_reader_needs(schema, work, tmp_path):
    table_ = pq.read_table(_path(work, schema))
    meta = json.loads(table_.schema.metadata[b"cope"])
    read = PARQUET[schema][2]
    for key, cells in table(f"`{schema}`", "Metadata").items():
        dest = tmp_path / f"without-{key}.parquet"
        less = {k: v for k, v in meta.items() if k != key}
        pq.write_table(table_.replace_schema_metadata({"cope": json.dumps(less)}), dest)
        required = cells[2].startswith("yes")
        try:
            read(dest)
        except parquet_io.CopeInputError:
            assert required, f"{key} is documented optional but the reader needs it"
        else:
            assert not required, f"{key} is documented required but the reader does without"


def test_geometry_and_platform_spec_keys_are_documented():
    common = "Conventions shared by all formats"
    assert list(table(common, "Model geometry")) == list(ModelGeometry.__dataclass_fields__)
    assert list(table("`cope.profile/2`", "Platform roofline spec")) == \
        list(PlatformSpec.__dataclass_fields__)


def test_profile_rows_table_lists_every_kind_and_name():
    needed = {(k[0], k[1]) for k in required_keys(8)} | {("shared", "decode")} | {
        ("shared", n) for n in SHARED_PARTS}
    doc = set()
    for cells in rows(section(section(DOC, 2, "`cope.profile/2`"), 3, "Rows an operating")):
        kind, = names(cells[0])
        doc |= {(kind, n) for n in names(cells[1])}
    assert doc == needed
    assert len(required_keys(8)) == 118
    assert "k = 8 that is 118 rows" in section(DOC, 2, "`cope.profile/2`")


# --- JSON policy and runtime formats ------------------------------------------------------------
#: Policy keys whose value is an object with fixed keys, all of which the row must name.
_NESTED = ("operating_point", "candidate", "vram", "layer_partition", "fill", "predicted_tpot_us",
           "runner_up", "trace", "provenance")


def test_every_policy_key_is_documented(work):
    data = json.loads((work / "policy.json").read_text())
    doc = table("`cope.policy/1`", "Keys")
    assert list(doc) == list(data)
    for key in _NESTED:
        assert set(data[key]) <= set(names(doc[key][2])), key
    assert set(data["provenance"]["inputs"]) | {"path", "sha256"} <= \
        set(names(doc["provenance"][2]))


def test_ktransformers_rule_keys_are_documented(work):
    from cope_core.export import read_policy
    from cope_core.export.ktransformers import ktransformers_rules

    def paths(obj, prefix=""):
        for k, v in obj.items():
            yield from paths(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]

    rules = ktransformers_rules(read_policy(work / "policy.json"))
    assert len(rules) == 2  # K = 2 of 6 over 3 layers: one CPU rule, one GPU rule
    written = {p for rule in rules for p in paths(rule)}
    assert set(table("Runtime formats", "KTransformers")) == written


def test_sglang_tensor_is_as_documented(work):
    torch = pytest.importorskip("torch")
    data = torch.load(work / "experts.pt", weights_only=True)
    assert isinstance(data, dict) and list(data) == ["logical_count"]
    t = data["logical_count"]
    g = tiny_geometry()
    assert t.dtype == torch.float32
    assert tuple(t.shape) == (1, g.dense_layers + g.n_layers, g.n_experts)
    assert t.sum().item() == 2 * g.n_layers  # K ones per MoE row
    body = section(section(DOC, 2, "Runtime formats"), 3, "SGLang-KT")
    assert "`float32`" in body and "`[1, dense_layers + n_layers, n_experts]`" in body
    assert "`logical_count`" in body


# --- predictor and hidden states ----------------------------------------------------------------
def _dims(cell: str, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(sizes[s.strip()] for s in names(cell)[0].strip("[]").split(","))


def test_predictor_tensors_and_metadata_are_documented(work):
    from safetensors import safe_open
    g = tiny_geometry()
    with safe_open(str(work / "predictor.safetensors"), framework="pt") as f:
        assert list(f.metadata()) == ["cope"]
        meta = json.loads(f.metadata()["cope"])
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    tensors = table("`cope.predictor/1`", "Tensors")
    assert set(tensors) == set(shapes)
    sizes = {"P": g.n_layers - 1, "H": 8, "U": meta["hidden_units"], "E": g.n_experts}
    for name, cells in tensors.items():
        assert _dims(cells[1], sizes) == shapes[name], name
    assert sorted(table("`cope.predictor/1`", "Metadata")) == sorted(meta)


def test_hidden_state_index_and_shards_are_documented(work):
    index = json.loads((work / "run.hidden" / "index.json").read_text())
    assert sorted(table("`cope.hidden/1`", "Index keys")) == sorted(index)
    g, first = tiny_geometry(), index["shards"][0]
    with np.load(work / "run.hidden" / first["file"], allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    doc = table("`cope.hidden/1`", "Shard arrays")
    assert set(doc) == set(arrays)
    sizes = {"n": first["tokens"], "L": g.n_layers, "H": index["hidden"], "top_k": g.top_k}
    for name, cells in doc.items():
        assert _dims(cells[2], sizes) == arrays[name].shape, name
        want = index["dtype"] if name == "hidden" else cells[1]
        assert str(arrays[name].dtype) == want, name


# --- importer inputs ----------------------------------------------------------------------------
def test_every_jsonl_field_the_importer_reads_is_documented():
    src = (ROOT / "cope_core" / "trace" / "sources" / "importers" / "jsonl.py").read_text()
    fields = {n for group in re.findall(r"_field\(obj, \(([^)]*)\)", src)
              for n in re.findall(r'"(\w+)"', group)}
    fields |= set(re.findall(r'obj\.get\("(\w+)"\)', src)) | set(re.findall(r'"(\w+)" in obj', src))
    assert {"prompt", "problem_id", "layer", "token_idx", "experts"} <= fields
    assert set(table("Importer inputs", "JSON lines")) == fields


def test_jsonl_example_imports_as_described(tmp_path):
    from cope_core.trace.sources.importers import import_jsonl
    block, = fenced(section(section(DOC, 2, "Importer inputs"), 3, "JSON lines"), "jsonl")
    (tmp_path / "routing.jsonl").write_text(block)
    trace, report = import_jsonl([tmp_path / "routing.jsonl"],
                                 get_model("mixtral-8x7b").with_layers(2))
    # gating_probs put expert 0 (0.7) before expert 7 (0.3) on the second line
    assert trace.routed.tolist() == [[[3, 5], [0, 7]], [[3, 1], [2, 7]]]
    assert trace.context.tolist() == [12, 13] and trace.prompt_ids.tolist() == [0]
    assert report.context_recorded and report.records_dropped == 0


# --- the page's Python examples run -------------------------------------------------------------
EXAMPLES = fenced(DOC, "python")


@pytest.mark.parametrize("i", range(len(EXAMPLES)))
def test_python_example_runs(i, work, monkeypatch):
    monkeypatch.chdir(work)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(EXAMPLES[i], f"docs/formats.md python block {i}", "exec"), {})
    assert out.getvalue()  # every example prints what it read


def test_examples_cover_every_format():
    used = " ".join(EXAMPLES)
    for name in ("trace.parquet", "profile.parquet", "measured.parquet", "policy.json",
                 "experts.pt", "predictor.safetensors", "run.hidden", "np.savez"):
        assert name in used, name
