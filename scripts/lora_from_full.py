"""Save a LoRA adapter approximating a fully fine-tuned model (`hpd finetune --full`), to ship it.

    python scripts/lora_from_full.py --base gemma3-270m --tuned RUN/epoch-5 --rank 64 --out ADAPTER_DIR

The adapter keeps the top `--rank` singular directions of each linear layer's weight change and the
changed norms whole (hpd_core/lora_from_full.py); it is written in float16 (`--float32` keeps
float32). It loads like any adapter: `hpd extract --model gemma3-270m --adapter ADAPTER_DIR`. Measure
it on validation before shipping it: a truncated change is not the tuned model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hpd_core.config import ModelConfig
from hpd_core.lora_from_full import lora_from_full
from hpd_core.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the model the run started from (as --model takes it)")
    parser.add_argument("--tuned", type=Path, required=True, help="the full fine-tune's directory")
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--float32", action="store_true", help="keep the adapter in float32 (default: float16)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    base, _ = load_model(ModelConfig(name=args.base, dtype="float32"))
    tuned, _ = load_model(ModelConfig(name=str(args.tuned), dtype="float32"))
    extraction = lora_from_full(base, tuned, args.rank)
    if not args.float32:
        extraction.model.half()
    extraction.model.save_pretrained(args.out)
    record = {"base": args.base, "tuned": str(args.tuned), "rank": args.rank, "kept": round(extraction.kept, 4),
              "linear_layers": extraction.layers, "saved_whole": len(extraction.whole)}
    (args.out / "lora_from_full.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
