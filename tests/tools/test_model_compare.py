"""`appliance model bench --variant/--compare`: variants measured in alternation on this
machine's real ONNX Runtime; those whose provider does not load listed with the reason."""

from __future__ import annotations

import json

from appliance.models.session import load_model, provider_problem
from appliance.tools.model_compare import (
    VARIANTS,
    compare_variants,
    format_comparison,
    variant_spec,
)
from tests.support.models import MODELS
from tests.support.warm_cli import run_appliance

PERSON = MODELS / "person_ssdlite.onnx"


def test_variants_alternate_and_each_is_measured() -> None:
    result = compare_variants(
        PERSON, ["cpu", "cpu+nospin"], duration_s=0.3, rounds=3, warmup=1, threads=1
    )
    # Three rounds, the first variant of each rotating.
    assert result.order == ("cpu", "cpu+nospin", "cpu+nospin", "cpu", "cpu", "cpu+nospin")
    assert result.shape == (1, 300, 300, 3)  # the tf_od decoder's default size
    cpu, nospin = result.variants
    for v in (cpu, nospin):
        assert v.unavailable is None
        assert v.providers[0] == "CPUExecutionProvider"
        assert v.runs >= 3  # at least one run per slice
        assert 0 < v.p50_ms <= v.p90_ms
        assert v.samples_per_s == v.runs_per_s  # batch 1


def test_a_variant_whose_provider_does_not_load_is_listed_with_the_reason() -> None:
    problem = provider_problem("tensorrt")
    result = compare_variants(PERSON, ["tensorrt+fp16", "cpu"], duration_s=0.2, rounds=1, warmup=0)
    trt, cpu = result.variants
    assert cpu.unavailable is None and cpu.runs >= 1
    if problem is None:  # TensorRT works here: it is measured, not refused
        assert trt.unavailable is None
    else:
        assert trt.unavailable == problem
        assert trt.runs == 0
        assert result.order == ("cpu",)
        table = format_comparison(result)
        assert f"tensorrt+fp16   unavailable: {problem}" in table.splitlines()


def test_the_cli_prints_one_table_or_one_json_object() -> None:
    args = [str(PERSON), "--variant", "cpu", "--variant", "cuda", "--duration", "0.2"]
    done = run_appliance(["model", "bench", *args, "--rounds", "2", "--warmup", "0", "--json"])
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [v["name"] for v in report["variants"]] == ["cpu", "cuda"]
    assert (report["variants"][1]["unavailable"] is None) == (provider_problem("cuda") is None)
    clash = run_appliance(["model", "bench", *args, "--provider", "cpu"])
    assert clash.returncode == 2
    assert "--provider does not go with --variant/--compare" in clash.stderr


def test_every_variant_is_a_config_the_appliance_accepts() -> None:
    for name, variant in VARIANTS.items():
        spec = variant_spec(PERSON, variant, threads=1)
        assert spec.providers == [*variant.providers, "cpu"], name
        assert spec.session.intra_op_threads == 1
    nospin = load_model("p", variant_spec(PERSON, VARIANTS["cpu+nospin"]), lambda p: p)
    options = nospin.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    graphs = variant_spec(PERSON, VARIANTS["cuda+graphs"])
    assert graphs.session.cuda.graphs is True
