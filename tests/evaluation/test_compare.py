"""The paired bootstrap behind `hpd evaluate --compare`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyarrow import fs

from datafiles.dataset import read_gold
from datafiles.predictions import read_predictions
from evaluation import compare
from evaluation.metrics import Counts, extractgpt_metric
from jobs.cli import main

from .test_evaluate import gold_dir, write_predictions  # noqa: F401  (gold_dir is a fixture)


def test_per_product_counts_sum_to_the_metrics_counts(tmp_path: Path, gold_dir: Path):  # noqa: F811
    write_predictions(fs.LocalFileSystem(), str(tmp_path / "run"))
    gold, predictions = read_gold(str(gold_dir / "gold.jsonl")), read_predictions(str(tmp_path / "run")).values
    rows = compare.product_counts(gold, predictions)
    assert len(rows) == len(gold)
    assert Counts(*map(sum, zip(*rows))) == extractgpt_metric(gold, predictions).counts
    assert compare.micro_f1(rows) == extractgpt_metric(gold, predictions).micro.f1 == 57.14


def test_a_run_against_itself_differs_by_nothing():
    rows = [(0, 0, 0, 2, 1), (0, 1, 0, 1, 0), (1, 0, 1, 0, 1)]
    result = compare.compare(rows, rows, draws=200)
    assert result.difference == result.low == result.high == 0 and result.a_ahead == 0


def test_a_run_better_on_most_products_is_ahead_in_most_draws():
    better = [(0, 0, 0, 2, 0)] * 30
    worse = [(0, 0, 0, 1, 1)] * 25 + [(0, 0, 0, 2, 0)] * 5
    result = compare.compare(better, worse, draws=500)
    assert result.difference > 0 and result.low > 0 and result.a_ahead == 1.0
    flipped = compare.compare(worse, better, draws=500)
    assert flipped.high < 0 and flipped.a_ahead == 0.0


def test_noise_gives_an_interval_around_zero():
    a = [(0, 0, 0, 1, 0), (0, 0, 0, 0, 1)] * 20
    b = [(0, 0, 0, 0, 1), (0, 0, 0, 1, 0)] * 20  # the same score, other products right
    result = compare.compare(a, b, draws=1000)
    assert result.difference == 0 and result.low < 0 < result.high and 0.3 < result.a_ahead < 0.7


def test_mismatched_runs_are_refused():
    with pytest.raises(ValueError, match="same, non-empty products"):
        compare.compare([(0, 0, 0, 1, 0)], [])


def test_cli_compare(tmp_path: Path, gold_dir: Path, capsys):  # noqa: F811
    write_predictions(fs.LocalFileSystem(), str(tmp_path / "a"))
    write_predictions(fs.LocalFileSystem(), str(tmp_path / "b"))
    assert main(["evaluate", "--predictions", str(tmp_path / "a"), "--compare", str(tmp_path / "b"),
                 "--gold", str(gold_dir / "gold.jsonl"), "--no-write", "--draws", "50"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["compare"]["against"] == str(tmp_path / "b")
    assert summary["compare"]["difference"] == 0 and summary["compare"]["products"] == 5
    assert summary["compare"]["draws"] == 50
