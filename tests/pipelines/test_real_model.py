"""The whole job on the real default model (slow): HPD and the no-cache oracle give identical values
and confidences through the pipeline, and the baseline fills every slot."""

from __future__ import annotations

import pytest

from .helpers import SAMPLE, by_slot, extract_args, read_attributes, report, run_extract


@pytest.mark.slow
def test_hpd_equals_reference_on_the_real_model(ray_cluster, tmp_path):
    """float32, K_max = 8, J = 2 on the first 6 sample products: value for value identical, and the
    confidences (HPD and the oracle, --confidence) equal to float32 rounding."""
    common = ["--limit", 6, "--docs-per-prompt", 2, "--max-value-tokens", 8, "--dtype", "float32"]
    outputs, confidence = {}, {}
    for decoder in ("hpd", "reference", "ar"):
        out = tmp_path / decoder
        argv = extract_args(SAMPLE, out, *common, *(["--confidence"] if decoder != "ar" else []))
        argv[argv.index("--decoder") + 1] = decoder
        assert run_extract(argv) == 0
        table = read_attributes(str(out))
        outputs[decoder] = by_slot(table, "value", "truncated")
        if decoder != "ar":
            confidence[decoder] = by_slot(table, "confidence")
        assert report(str(out))["products_out"] == 6 and report(str(out))["dtype"] == "float32"
        assert report(str(out))["spans"] == "on"  # --spans auto on a CPU: span decoding, oracle included
        assert report(str(out))["compiled"] == "off"  # float32 keeps the eager pieces; the oracle has none
        # the engine's batches by step shape (a CPU: packed); the oracle has no batches
        batches = (report(str(out))["batches_fixed_steps"], report(str(out))["batches_packed_steps"])
        assert batches == (0, 0) if decoder == "reference" else batches[0] == 0 and batches[1] >= 1
    assert outputs["hpd"] == outputs["reference"]
    assert any(value is not None for value, _ in outputs["hpd"].values())
    keys = sorted(confidence["hpd"])
    assert keys == sorted(confidence["reference"]) and all(0 < confidence["hpd"][k] <= 1 for k in keys)
    assert [confidence["hpd"][k] for k in keys] == pytest.approx([confidence["reference"][k] for k in keys], rel=1e-4)
    assert set(outputs["ar"]) == set(outputs["hpd"])  # the baseline answers the same slots


@pytest.mark.slow
def test_compile_layers_auto_leaves_a_small_job_eager(ray_cluster, tmp_path):
    """bf16 on a CPU compiles the layers' pieces when asked, and ``auto`` does not for a job this small
    (pipelines.extract_stage.COMPILE_MIN_PRODUCTS_PER_ACTOR); the report says what ran."""
    compiled = {}
    for setting in ("auto", "on"):
        out = tmp_path / setting
        argv = extract_args(SAMPLE, out, "--limit", 3, "--dtype", "bfloat16", "--compile-layers", setting)
        argv[argv.index("--decoder") + 1] = "hpd"
        assert run_extract(argv) == 0
        compiled[setting] = report(str(out))["compiled"]
    assert compiled == {"auto": "off", "on": "on"}


@pytest.mark.slow
def test_a_finished_job_of_another_prompt_format_is_reported_not_refused(ray_cluster, tmp_path, capsys):
    """A resume by a version that prompts otherwise is refused (tests/jobs/test_extract_cli.py);
    running a job that is finished only reports it, whichever version finished it."""
    from jobs import checks
    from pipelines import io

    out = tmp_path / "out"
    argv = extract_args(SAMPLE, out, "--limit", 2, "--max-value-tokens", 4)
    argv[argv.index("--decoder") + 1] = "hpd"
    assert run_extract(argv) == 0
    job = io.read_json(io.join(str(out), "_job.json"))
    assert job["arguments"][checks.PROMPT_FORMAT] >= 2
    job["arguments"][checks.PROMPT_FORMAT] = 1  # finished by the version before
    io.write_json(io.join(str(out), "_job.json"), job)
    capsys.readouterr()
    assert run_extract(argv) == 0
    assert "is already complete" in capsys.readouterr().err
