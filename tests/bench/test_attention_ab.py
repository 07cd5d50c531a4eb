"""scripts/gpu_attention_ab.py: the split attention it times on a GPU (the prompt part without a
mask, the rest with it, merged by their log-sum-exps) is the engine's masked call, checked here with
PyTorch's CPU flash kernel for both parts."""

from __future__ import annotations

import pytest

from tests.scripts import load_script

attention_ab = load_script("gpu_attention_ab")


@pytest.mark.parametrize("shape", [[], ["--rows", "2", "--queries", "5", "--prompt", "17", "--rest", "9", "--density", "0.5"]])
def test_the_split_attention_is_the_masked_one(shape, capsys):
    assert attention_ab.main(["--device", "cpu", *shape]) == 0
    diff = float(capsys.readouterr().out.split("largest |engine - split|: ")[1].split()[0])
    assert diff < 1e-5
