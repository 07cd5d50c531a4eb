"""The whole job (`hpd extract` through local Ray: ExtractStage actors, stacking, commit) on a tiny
random model saved to a local directory (--model DIR), float32: HPD and the no-cache oracle give
identical values. The same check on the real default model is slow (test_real_model.py)."""

from __future__ import annotations

from .helpers import SAMPLE, extract_args, read_attributes, report, run_extract


def _values(table) -> dict:
    rows = table.select(["product_id", "attribute", "value", "truncated"]).to_pylist()
    return {(r["product_id"], r["attribute"]): (r["value"], r["truncated"]) for r in rows}


def test_hpd_equals_reference_through_the_job_on_a_tiny_model(ray_cluster, tmp_path):
    from tests.hpd_core.conftest import build_tokenizer, tiny_model

    model_dir = tmp_path / "tiny-llama"
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(model_dir)
    tiny_model("llama", len(tokenizer)).save_pretrained(model_dir)
    common = ["--model", model_dir, "--limit", 6, "--docs-per-prompt", 2, "--max-value-tokens", 6, "--dtype", "float32",
              "--max-actors", 1]
    outputs = {}
    for decoder in ("hpd", "reference"):
        out = tmp_path / decoder
        argv = extract_args(SAMPLE, out, *common)
        argv[argv.index("--decoder") + 1] = decoder
        assert run_extract(argv) == 0
        outputs[decoder] = _values(read_attributes(str(out)))
        done = report(str(out))
        assert done["products_out"] == 6 and done["dtype"] == "float32" and done["spans"] == "on"  # auto: on a CPU
    assert outputs["hpd"] == outputs["reference"]
    assert len(outputs["hpd"]) > 6 and any(value is not None for value, _ in outputs["hpd"].values())
