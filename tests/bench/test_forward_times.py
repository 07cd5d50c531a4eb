"""scripts/forward_times.py: every forward of a timed run is in its report, once, with the tokens
the bench counted, beside the LM head's calls and the tokenization, and the hooks are gone
afterwards."""

from __future__ import annotations

import json

import bench.compare
import hpd_core.autoregressive
import hpd_core.engine
import hpd_core.graphs
import hpd_core.runner
from jobs import cli
from tests.bench.test_bench import SMALL, tokenizer, tokenizer_dir  # noqa: F401 (fixtures)
from tests.scripts import load_script

forward_times = load_script("forward_times")


def test_every_forward_of_the_timed_run_is_reported(capsys, tmp_path, tokenizer_dir):  # noqa: F811
    runner = hpd_core.runner.ModelRunner
    hooks = (runner.forward, runner.next_tokens, runner.allowed_tokens, runner.logits, hpd_core.graphs.StepGraph.__call__,
             bench.compare.timed, hpd_core.engine.HPDDecoder.prepare, hpd_core.autoregressive.AutoregressiveDecoder.prepare)
    out = tmp_path / "times"
    out.mkdir()
    with forward_times.installed(out):
        assert cli.main(["bench", "--synthetic", "--random-arch", "tiny", "--tokenizer", tokenizer_dir,
                         "--num-products", "4", "--docs-per-prompt", "2", *SMALL, "--batch-size", "2",
                         "--out", str(tmp_path / "bench")]) == 0  # fmt: skip
    assert (runner.forward, runner.next_tokens, runner.allowed_tokens, runner.logits, hpd_core.graphs.StepGraph.__call__,
            bench.compare.timed, hpd_core.engine.HPDDecoder.prepare,
            hpd_core.autoregressive.AutoregressiveDecoder.prepare) == hooks  # fmt: skip
    capsys.readouterr()
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    for name in ("ar", "hpd"):
        text = (out / f"forwards-{name}.txt").read_text()
        timed = [line.split() for line in text.splitlines()[2:] if line and line.split()[0] in ("prefix", "prefill", "step", "head", "prepare")]
        rows = [r for r in timed if r[0] not in ("head", "prepare")]
        kinds = [r[0] for r in rows]
        assert [r[0] for r in timed].count("prepare") == 1  # the requests tokenized once, before any forward
        assert timed[0][0] == "prepare" and int(timed[0][1]) == report[name]["requests"]
        assert [r[0] for r in timed].count("head") >= kinds.count("step")  # a choice after every step (and prefill)
        assert len(rows) - kinds.count("prefix") == report[name]["forward_passes"]  # the bench counts prefixes apart
        assert kinds.count("prefix") == report[name]["shared_prefix_prefills"] >= 1
        assert kinds.count("prefill") == report[name]["batches"]  # prefill forwards
        sums = {line.split(":")[0]: line for line in text.splitlines() if " forwards, " in line}
        for kind, line in sums.items():
            assert int(line.split(" forwards, ")[1].split()[0]) == sum(int(r[1]) for r in timed if r[0] == kind)
        inside = sum(float(r[3]) for r in timed) / 1e3
        outside = float(text.split("outside these: ")[1].split()[0])
        run = float(text.split("one timed run, ")[1].split()[0])
        assert outside >= 0 and abs(inside + outside - run) < 0.01 * len(timed) + 0.002
