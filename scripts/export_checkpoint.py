"""Save a LoRA adapter from an `hpd finetune` checkpoint (a run still going, or interrupted).

    python scripts/export_checkpoint.py --checkpoint OUT/checkpoint/checkpoint.pt --model default-base \
        --lora-rank 64 --lora-alpha 128 --out ADAPTER_DIR

The LoRA options must be the run's (its command line); the checkpoint holds the trainable weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hpd_core.checkpoint import load_weights
from hpd_core.config import ModelConfig, TrainConfig
from hpd_core.finetune import prepare_model
from hpd_core.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--model", default="default-base")
    parser.add_argument("--lora-rank", type=int, default=TrainConfig(docs_per_prompt=1).lora_rank)
    parser.add_argument("--lora-alpha", type=int, default=TrainConfig(docs_per_prompt=1).lora_alpha)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    state = torch.load(args.checkpoint, weights_only=False)
    model, tokenizer = load_model(ModelConfig(name=args.model))
    model = prepare_model(model, TrainConfig(docs_per_prompt=1, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha))
    try:
        load_weights(state, model)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    model.save_pretrained(args.out)
    report = state["report"]
    (args.out / "checkpoint_report.json").write_text(json.dumps(
        {"epoch": state["epoch"], "micro": state["micro"], "steps": report["steps"], "val_losses": report["val_losses"]},
        indent=2) + "\n")
    print(json.dumps({"out": str(args.out), "steps": report["steps"], "val_losses": report["val_losses"]}))


if __name__ == "__main__":
    main()
