"""The whole job (`hpd extract` through local Ray: ExtractStage actors, stacking, commit) on a tiny
random model saved to a local directory (--model DIR), float32: HPD and the no-cache oracle give
identical values, and the same confidences. The same check on the real default model is slow
(test_real_model.py)."""

from __future__ import annotations

import pytest

from .helpers import SAMPLE, by_slot, extract_args, read_attributes, report, run_extract


def saved_tiny_model(tmp_path):
    """A tiny random Llama and the tests' tokenizer, saved as a model directory for --model."""
    from tests.hpd_core.conftest import build_tokenizer, tiny_model

    model_dir = tmp_path / "tiny-llama"
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(model_dir)
    tiny_model("llama", len(tokenizer)).save_pretrained(model_dir)
    return model_dir


def test_hpd_equals_reference_through_the_job_on_a_tiny_model(ray_cluster, tmp_path):
    model_dir = saved_tiny_model(tmp_path)
    common = ["--model", model_dir, "--limit", 6, "--docs-per-prompt", 2, "--max-value-tokens", 6, "--dtype", "float32",
              "--max-actors", 1]
    outputs, confidence = {}, {}
    for decoder, flags in (("hpd", ["--confidence"]), ("reference", ["--confidence"]), ("hpd-plain", [])):
        out = tmp_path / decoder
        argv = extract_args(SAMPLE, out, *common, *flags)
        argv[argv.index("--decoder") + 1] = decoder.removesuffix("-plain")
        assert run_extract(argv) == 0
        table = read_attributes(str(out))
        outputs[decoder] = by_slot(table, "value", "truncated")
        if flags:
            confidence[decoder] = by_slot(table, "confidence")
        else:
            assert "confidence" not in table.column_names  # only when asked for
        done = report(str(out))
        assert done["products_out"] == 6 and done["dtype"] == "float32" and done["spans"] == "on"  # auto: on a CPU
    assert outputs["hpd"] == outputs["reference"] == outputs["hpd-plain"]
    assert len(outputs["hpd"]) > 6 and any(value is not None for value, _ in outputs["hpd"].values())
    keys = sorted(confidence["hpd"])
    assert keys == sorted(confidence["reference"])
    scored = [k for k in keys if confidence["hpd"][k] is not None]  # none: a parse error's null, or the text check's
    assert scored == [k for k in keys if confidence["reference"][k] is not None] and len(scored) > 6
    assert [confidence["hpd"][k] for k in scored] == pytest.approx([confidence["reference"][k] for k in scored], rel=1e-4)
    assert all(0 < confidence["hpd"][k] <= 1 for k in scored) and len({confidence["hpd"][k] for k in scored}) > 1


def test_a_value_the_text_check_drops_loses_its_confidence(ray_cluster, tmp_path):
    """Without span decoding the random model writes values found in no text of their product: the
    text check writes them as null, and their confidence with them (a null value's confidence is
    the model's for its own null answer, which it did not give). Its other slots are mostly parse
    errors, whose nulls have no confidence either (that every other value keeps its confidence:
    the test above and tests/pipelines/test_values_in_text.py)."""
    model_dir = saved_tiny_model(tmp_path)
    out = tmp_path / "out"
    argv = extract_args(SAMPLE, out, "--model", model_dir, "--limit", 6, "--docs-per-prompt", 2, "--max-value-tokens", 6,
                        "--dtype", "float32", "--max-actors", 1, "--spans", "off", "--confidence")  # fmt: skip
    argv[argv.index("--decoder") + 1] = "hpd"
    assert run_extract(argv) == 0
    rows = read_attributes(str(out)).select(["value", "confidence"]).to_pylist()
    done = report(str(out))
    dropped = done["values_not_in_text"]
    assert done["confidence"] is True  # the report says the files have the column
    unscored = sum(1 for r in rows if r["confidence"] is None)  # the text check's nulls, and parse errors' nulls
    assert dropped > 0 and dropped <= unscored <= dropped + done["parse_errors"]
    assert all(r["value"] is None for r in rows if r["confidence"] is None)

