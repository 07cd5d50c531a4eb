"""scripts/gpu_attention_ab.py: the split attention it times on a GPU (the prompt part without a
mask, the rest with it, merged by their log-sum-exps) is the engine's masked call, checked here with
PyTorch's CPU flash kernel for both parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_attention_ab.py"
spec = importlib.util.spec_from_file_location("gpu_attention_ab", SCRIPT)
attention_ab = sys.modules["gpu_attention_ab"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(attention_ab)


@pytest.mark.parametrize("shape", [[], ["--rows", "2", "--queries", "5", "--prompt", "17", "--rest", "9", "--density", "0.5"]])
def test_the_split_attention_is_the_masked_one(shape, capsys):
    assert attention_ab.main(["--device", "cpu", *shape]) == 0
    diff = float(capsys.readouterr().out.split("largest |engine - split|: ")[1].split()[0])
    assert diff < 1e-5
