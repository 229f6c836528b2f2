"""llama-bench rows on several devices (issue 72): their device fields read, the placement read
back from them as llama.cpp makes it, priced block by block, and the rows that cannot be priced
listed with why."""
from __future__ import annotations

import json

import pytest

from cope_core.errors import CopeInputError
from cope_core.llamacpp.answer.devices_answer import Cards
from cope_core.llamacpp.bench.bench_devices import row_blocks, uses_several
from cope_core.llamacpp.bench.bench_eval import match_bench_rows, model_tensor_bytes
from cope_core.llamacpp.bench.bench_file import parse_llama_bench
from cope_core.llamacpp.placement.device_search import blocks_tpot
from cope_core.llamacpp.placement.vram import llama_model_of
from cope_core.machine import compose_machine
from cope_core.models import resolve_model
from cope_core.profile.analytic import analytic_profile

HOST = r"blk\.(1[7-9]|[2-8][0-9]|9[0-3])\.ffn_(up|down|gate)_exps=CPU"


def _setup():
    g = resolve_model("qwen3-235b-a22b", "Q4_K_M")
    m = llama_model_of(g)
    mc = compose_machine(gpu="rtx3090,rtx3090", cpu="ryzen-9-7950x", memory="ddr5-6000x2")
    return g, m, mc, Cards.of(mc)


def _row(m, **over) -> dict:
    row = {"build_commit": "abc", "build_number": 11434, "gpu_info": "NVIDIA GeForce RTX 3090, "
           "NVIDIA GeForce RTX 3090", "backends": "CUDA", "model_filename": "q.gguf",
           "model_type": "qwen3moe 235B.A22B Q4_K - Medium", "model_size": model_tensor_bytes(m),
           "n_threads": 16, "n_gpu_layers": 99, "n_cpu_moe": 0, "split_mode": "layer",
           "main_gpu": 0, "devices": "CUDA0/CUDA1", "tensor_split": "17.00/78.00",
           "tensor_buft_overrides": HOST, "n_prompt": 0, "n_gen": 128, "n_depth": 0,
           "avg_ts": 9.5, "stddev_ts": 0.1}
    row.update(over)
    return row


def _rows(m, *rows):
    return parse_llama_bench(json.dumps(list(rows), indent=1), "bench.json")


def test_the_device_fields_are_read():
    g, m, mc, cards = _setup()
    (r,) = _rows(m, _row(m))
    assert (r.devices, r.tensor_split, r.split_mode, r.main_gpu) == \
        ("CUDA0/CUDA1", (17.0, 78.0), "layer", 0)
    (old,) = _rows(m, {k: v for k, v in _row(m).items()
                       if k not in ("devices", "tensor_split", "split_mode", "main_gpu")})
    assert (old.devices, old.tensor_split, old.split_mode) == ("auto", (0.0,), "layer")
    with pytest.raises(CopeInputError, match="tensor_split"):
        _rows(m, _row(m, tensor_split="1/x"))
    with pytest.raises(CopeInputError, match="split_mode"):
        _rows(m, _row(m, split_mode="diagonal"))


def test_markdown_names_the_device_columns():
    text = ("| model | size | params | backend | ngl | dev | ts | test | t/s |\n"
            "| --- | ---: | ---: | --- | --: | --- | --- | --: | --: |\n"
            "| qwen3moe | 1.00 GiB | 2 B | CUDA | 99 | CUDA0/CUDA1 | 1.00/3.00 | tg128 | "
            "10.00 ± 0.10 |\n")
    (r,) = parse_llama_bench(text, "b.md")
    assert r.devices == "CUDA0/CUDA1" and r.tensor_split == (1.0, 3.0)


def test_the_row_places_layers_and_experts_as_llamacpp_does():
    g, m, mc, cards = _setup()
    (r,) = _rows(m, _row(m))
    assert uses_several(r, cards)
    attention, experts, used, why = row_blocks(r, m, cards)
    assert not why and used == [0, 1]
    assert attention == [0] * 17 + [1] * 77
    assert experts == [0] * 17 + [-1] * 77


def test_a_row_on_two_cards_is_priced_block_by_block():
    g, m, mc, cards = _setup()
    (r,) = _rows(m, _row(m))
    prof = analytic_profile(g, mc.spec, cpu_threads=[16])
    (x,) = match_bench_rows([r], m, g, prof, cards=cards)
    assert x.matched and x.n_cpu == 77
    want = blocks_tpot(cards.costs(g, 16, 64.5), [0] * 17 + [1] * 77, [0] * 17 + [-1] * 77,
                       cards.handoff(g))
    assert x.predicted_ts == pytest.approx(1e6 / want)
    (y,) = match_bench_rows([r], m, g, prof)
    assert not y.matched and "--gpu a,b" in y.reason


@pytest.mark.parametrize("over,why", [
    ({"split_mode": "row"}, "-sm row"),
    ({"devices": "CUDA0/CUDA3"}, "the machine's cards"),
    ({"tensor_buft_overrides": r"blk\.3\.attn_q=CUDA1"}, "off its layer's card"),
    ({"tensor_buft_overrides": r"blk\.3\.ffn_up_exps=CUDA1;blk\.3\.ffn_down_exps=CPU"},
     "split between devices"),
    ({"tensor_buft_overrides": r"blk\.3\.ffn_up_exps=CUDA7"}, "no such device"),
])
def test_rows_not_priced_say_why(over, why):
    g, m, mc, cards = _setup()
    (r,) = _rows(m, _row(m, **over))
    prof = analytic_profile(g, mc.spec, cpu_threads=[16])
    (x,) = match_bench_rows([r], m, g, prof, cards=cards)
    assert not x.matched and why in x.reason


def test_experts_on_the_other_card_cross_twice():
    g, m, mc, cards = _setup()
    (r,) = _rows(m, _row(m, tensor_split="0.00", devices="auto",
                         tensor_buft_overrides=r"blk\.(2|3)\.ffn_(up|down|gate)_exps=CUDA1"))
    attention, experts, used, why = row_blocks(r, m, cards)
    assert not why and experts[2] == experts[3] == 1 and attention[2] == 0
    assert attention.count(0) == 48                     # equal cards: 95 indices, 48 first


def test_the_published_rows_table_is_current_and_bad_rows_are_refused(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "scripts" / "multigpu_rows.py"), "--check"],
                       capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    sys.path.insert(0, str(root / "scripts"))
    import multigpu_rows as mr
    doc = json.loads(mr.DATA.read_text())
    del doc["rows"][0]["split"]
    bad = tmp_path / "rows.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(CopeInputError, match="lacks"):
        mr.load(bad)
    doc = json.loads(mr.DATA.read_text())
    doc["rows"][2]["same_rig"] = "nowhere"
    bad.write_text(json.dumps(doc))
    with pytest.raises(CopeInputError, match="no row"):
        mr.load(bad)
