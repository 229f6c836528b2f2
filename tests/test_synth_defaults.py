"""A synthetic trace for any catalog model, made as the shipped examples' are."""
import json

import numpy as np
import pytest

from cope_core.errors import CopeInputError
from cope_core.geometry import CATALOG, get_model
from cope_core.models.formats import apply_preset
from cope_core.trace import synth_defaults as sd
from cope_core.trace.synth import synthesize


def test_a_fitted_model_takes_its_own_skew_and_the_shared_reuse():
    doc = json.loads(sd.PARAMETERS_FILE.read_text())
    for name, fitted in doc["models"].items():
        d = sd.synth_defaults(get_model(name))
        assert (d.skew, d.reuse, d.predictor_accuracy) == (
            fitted["skew"], doc["reuse"]["value"], doc["predictor_accuracy"])
        assert f"fitted for {name}" in d.basis


def test_an_unfitted_model_takes_the_nearest_routing_shape_and_says_so():
    # GLM-4.5-Air and gpt-oss-120b route over 128 experts, as Qwen3-30B-A3B (top-8 of 128)
    for name in ("glm-4.5-air", "gpt-oss-120b", "qwen3-235b-a22b"):
        d = sd.synth_defaults(get_model(name))
        assert d.skew == sd.synth_defaults(get_model("qwen3-30b-a3b")).skew
        assert "of qwen3-30b-a3b" in d.basis and "an assumption" in d.basis
    # 256 experts: Qwen3.5-35B-A3B's, the one fitted model with 256
    assert sd.synth_defaults(get_model("deepseek-v3")).skew == \
        sd.synth_defaults(get_model("qwen3.5-35b-a3b")).skew
    # qwen1.5-moe (top-4 of 60): no fitted model has 60 experts; top-6 (deepseek-v2-lite, 64)
    # and top-2 (mixtral, 8) are equally near top-4, and 64 experts is nearer 60 than 8
    assert "of deepseek-v2-lite" in sd.synth_defaults(get_model("qwen1.5-moe-a2.7b")).basis


def test_synthetic_inputs_are_the_shipped_shapes_of_one_seeded_model():
    g = apply_preset(CATALOG["gpt-oss-120b"], "MXFP4_MOE").with_layers(3)
    trace, cal = sd.synthetic_inputs(g, seed=5)
    assert trace.model == g and cal.model == g
    assert (trace.n_prompts, trace.n_tokens) == (sd.TRACE_PROMPTS, sd.TRACE_PROMPTS * sd.TOKENS)
    assert (cal.n_prompts, cal.n_tokens) == (sd.CALIBRATION_PROMPTS,
                                             sd.CALIBRATION_PROMPTS * sd.TOKENS)
    assert trace.source == cal.source == "synthetic"
    d = sd.synth_defaults(g)
    # exactly what `cope synth` makes with these parameters
    ref = synthesize(g, prompts=sd.TRACE_PROMPTS, tokens=sd.TOKENS, seed=5, skew=d.skew,
                     reuse=d.reuse, predictor_accuracy=d.predictor_accuracy)
    np.testing.assert_array_equal(trace.routed, ref.routed)
    again, _ = sd.synthetic_inputs(g, seed=5)
    np.testing.assert_array_equal(again.routed, trace.routed)
    assert not np.array_equal(sd.synthetic_inputs(g, seed=6)[0].routed, trace.routed)


def test_a_broken_parameters_file_is_one_line(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text("{")
    with pytest.raises(CopeInputError, match="synthetic traces' parameters"):
        sd._parameters(bad)
