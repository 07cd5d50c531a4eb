"""training/data.py: records are validated as the extraction job validates them."""

from __future__ import annotations

import json
import logging

from pipelines.schema import ValidationConfig, parse_schema
from training.data import accepted_records


def test_records_cut_to_the_text_limit_are_said(tmp_path, caplog):
    """A record longer than --max-text-chars is cut as `hpd extract` cuts it; fine-tuning used to say
    nothing of it (helper-46, session 55: a 30,000-character record trained on its first 20,000)."""
    limit = ValidationConfig().max_text_chars
    records = tmp_path / "records.jsonl"
    rows = [{"product_id": "a", "category": "Tea", "title": "Green tea " + "leaf " * (limit // 4)},
            {"product_id": "b", "category": "Tea", "title": "Black tea"}]
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        accepted, stats, _ = accepted_records(records, parse_schema({"Tea": ["Brand"]}))
    assert [a.input_truncated for a in accepted] == [True, False] and len(accepted[0].product.title) <= limit
    assert stats == {"records": 2, "rejected": {}}  # unchanged: the stats are a training run's identity
    assert f"1 record(s) of {records} had their text cut to {limit} characters" in caplog.text
