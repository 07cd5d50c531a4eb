"""Training checkpoints: the whole state of a fine-tuning run, so that a resumed run equals an
uninterrupted one.

A checkpoint holds the trainable weights (LoRA or the fine-tuned body), the optimizer and LR
schedule, the report so far, where the run stands (epoch, next micro-batch) with the Python RNG
state at the start of that epoch (its stacking and shuffle are replayed from it), and torch's RNG
state (dropout). It is written to a temporary file and renamed, so an interruption while saving
leaves the previous checkpoint intact.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

FILE = "checkpoint.pt"


def save(directory: Path, model, optimizer, scheduler, report, epoch: int, micro: int, rng_state) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "weights": {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "report": dataclasses.asdict(report),
        "epoch": epoch,
        "micro": micro,
        "python_rng": rng_state,
        "torch_rng": torch.get_rng_state(),
        # dropout on a GPU draws from that device's CUDA generator: restored too, so a resumed run on
        # a GPU is the uninterrupted one (training runs on the model's one device; None on a CPU)
        "cuda_rng": torch.cuda.get_rng_state(_device(model)) if _device(model).type == "cuda" else None,
    }
    tmp = directory / (FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, directory / FILE)
    return directory / FILE


def _device(model) -> torch.device:
    return next(model.parameters()).device


def load(directory: Path) -> dict | None:
    """The last checkpoint in ``directory``, or None if there is none."""
    path = directory / FILE
    if not path.is_file():
        return None
    return torch.load(path, weights_only=False)  # our own file: it holds the Python RNG state


def load_weights(state: dict, model) -> None:
    """Copy a checkpoint's trainable weights into ``model`` (prepared as the run's was)."""
    params = dict(model.named_parameters())
    missing = [name for name in state["weights"] if name not in params]
    if missing:
        raise ValueError(f"checkpoint does not match the model (e.g. {missing[0]!r}): same --model and options?")
    with torch.no_grad():
        for name, value in state["weights"].items():
            params[name].copy_(value)


def restore(state: dict, model, optimizer, scheduler, report) -> tuple[int, int, object]:
    """Load ``state`` into the run's objects; returns (epoch, next micro-batch, epoch RNG state)."""
    load_weights(state, model)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    for key, value in state["report"].items():
        setattr(report, key, value)
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and _device(model).type == "cuda":  # none before 2026-11-29
        torch.cuda.set_rng_state(state["cuda_rng"], _device(model))
    return state["epoch"], state["micro"], state["python_rng"]
