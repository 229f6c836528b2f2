"""The sidebar's request (issue 64) under Streamlit's AppTest: the prompt and answer lengths are
kept in the URL across pages, the Export page's llama.cpp answer is the library's for that
request, and the Overview shows its time to the first token from the same answer."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from cope_core.app.apptest import open_unbroken
from cope_core.export import EXPORT_FORMATS, build_policy
from cope_core.export.llamacpp import lead_line
from cope_core.llamacpp import LlamaSettings, Request
from cope_core.machine import compose_machine
from cope_core.models import resolve_model
from cope_core.profile.analytic import analytic_profile
from cope_core.trace.synth_defaults import synthetic_inputs

APP = Path(__file__).resolve().parents[1] / "app.py"
LLAMACPP_TAB = next(f.label for f in EXPORT_FORMATS if f.name == "llama.cpp")
MINE = dict(example="gpt-oss-120b", quant="MXFP4_MOE", gpu="rtx3090", cpu="ryzen-9-7950x")


def open_app(page: str | None = None, **query: str) -> AppTest:
    """The app at ``page`` (None: the Overview) opened from a link with ``query``, raising
    nothing."""
    return open_unbroken(APP, page, **query)


@pytest.mark.slow
def test_the_request_is_kept_in_the_url_across_pages():
    at = open_app("export", **MINE, ptok="16384", gtok="256")
    box = {n.label: n for n in at.sidebar.number_input}
    assert box["Prompt (tokens)"].value == 16384 and box["Answer (tokens)"].value == 256
    tab = next(t for t in at.tabs if t.label == LLAMACPP_TAB)
    lead = tab.markdown[0].value
    assert lead.startswith(("Faster for this request", "The default is kept")) and \
        "Request (16,384-token prompt, 256-token answer): first token in" in lead
    # the command the lead speaks of comes first in its tab, with the -ub the request needs
    assert tab.code[0].value.startswith("llama-server")
    at.switch_page("pages/overview.py").run()
    assert not at.exception and at.query_params["ptok"] == "16384"
    metric = {x.label: x.value for x in at.metric}
    assert float(metric["First token (s), llama.cpp"]) > 0
    assert float(metric["Request (s), llama.cpp"]) > float(metric["First token (s), llama.cpp"])
    at.switch_page("pages/landscape.py").run()
    assert not at.exception and at.query_params["gtok"] == "256"


@pytest.mark.slow
def test_host_memory_in_the_sidebar_prices_the_pinned_load():
    """The sidebar's host memory (``ramgib``) is `cope advise --ram`: with room for the host
    experts the Export page's llama.cpp command loads without mmap."""
    at = open_app("export", **MINE, ptok="16384", gtok="512", ramgib="256")
    assert not at.exception and at.query_params["ramgib"] == "256"
    box = {n.label: n for n in at.sidebar.number_input}
    assert box["Host memory (GiB)"].value == 256
    tab = next(t for t in at.tabs if t.label == LLAMACPP_TAB)
    assert "--load-mode none" in tab.code[0].value


def test_a_zero_prompt_ranks_by_decode_and_says_so():
    at = open_app(None, **MINE, ptok="0")
    metric = {x.label: x.value for x in at.metric}
    assert metric["First token (s), llama.cpp"] == "—"
    assert "Speed (tokens/s)" in metric and "tokens" not in metric["Speed (tokens/s)"]


def test_lead_and_first_request_agree():
    g = resolve_model("qwen3-30b-a3b", "Q4_K_M")
    m = compose_machine(gpu="rtx3060-12gb", cpu="ryzen-7-5700x")
    assert m.spec is not None
    tr, cal = synthetic_inputs(g)
    req = Request(16384, 512)
    pol = build_policy(tr, analytic_profile(g, m.spec, cpu_threads=[m.threads]), cal,
                       vram_gib=11.0, context=req.tokens, cpu_threads=m.threads,
                       llama=LlamaSettings(n_ctx=req.tokens), request=req)
    first = pol.llamacpp_answer.recommended.request      # what the Overview shows
    assert first is not None
    lead = lead_line(pol)
    assert lead is not None and f"first token in {first.ttft_s:.1f} s" in lead
    assert f"{first.request_s:.1f} s in all" in lead


def test_the_overviews_request_metrics_say_why_when_not_priced():
    from cope_core.app.whatif import request_metrics
    none = request_metrics(None, None, "cope")
    assert [v for _, v, _ in none] == ["—", "—"] and "prompt is 0" in none[0][2]
    assert "cope estimator" in request_metrics(None, Request(), "hrm")[0][2]
    assert "measured profile" in request_metrics(None, Request(), "cope")[1][2]
    # a backend the prompt model does not price says so (issue 71)
    from cope_core.app.whatif import unpriced_of
    g = resolve_model("qwen3.5-35b-a3b", "Q4_K_M")
    amd = compose_machine(gpu="rx9070xt", cpu="ryzen-9-7950x").spec
    why = unpriced_of(g, {"spec": amd.to_dict()})
    assert why is not None and "20292" in why
    assert why in request_metrics(None, Request(), "cope", why)[0][2]
    nv = compose_machine(gpu="rtx4090", cpu="ryzen-9-7950x").spec
    assert unpriced_of(g, {"spec": nv.to_dict()}) is None and unpriced_of(g, None) is None
    from cope_core.llamacpp import RequestSetting
    s = RequestSetting("searched", 3, 3.0, 0, 1024, 2048, 1000, 100, 2.0, 10_000.0, 10_000.0,
                       0.1)
    (l1, v1, h1), (l2, v2, h2) = request_metrics(s, Request(1000, 100), "cope")
    assert (v1, v2) == ("2.0", "3.0") and "-ub 1024" in h1 and "100.0 tokens/s" in h2
