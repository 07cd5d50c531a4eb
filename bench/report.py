"""`hpd bench` report: what every bench.json / sweep.json starts with (command, arguments, machine,
model, settings), and writing it. The Markdown and the plot are rendered by bench/plot.py."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from hpd_core.config import DecodeConfig
from bench.measure import TimingConfig


def command_line() -> str | None:
    """The command as typed, when run from the ``hpd`` script (None under a test runner)."""
    if Path(sys.argv[0]).name not in ("hpd", "cli.py"):
        return None
    return "hpd " + shlex.join(sys.argv[1:])


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def machine_info(device: str) -> dict:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").is_file():
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    info = {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average_start": load_average(),
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def report_header(args: argparse.Namespace, model_info: dict, decode_cfg: DecodeConfig, timing: TimingConfig) -> dict:
    """The report's first keys; the run adds its workload and results."""
    return {
        "command": command_line(),
        "args": {k: v for k, v in vars(args).items() if k != "command"},
        "machine": machine_info(args.device),
        "model": model_info,
        "decode": asdict(decode_cfg),
        "timing": asdict(timing),
    }


def write_json(path: Path, report: dict) -> None:
    path.write_text(json.dumps(report, indent=2) + "\n")
