#!/usr/bin/env bash
# The GPU checks of the engine issue in one command, for a machine lent through the device tool
# (CUDA with PyTorch, transformers and peft installed; no Ray, no gguf, nothing can be fetched).
# Everything lands under $OUT (the device tool's folder; ./gpu-out elsewhere):
#   env.txt            the GPU, driver, torch and transformers versions
#   gpu-tests.txt      pytest -m gpu: CUDA == the CPU oracle in float32 on the tiny architectures,
#                      fixed-shape steps, bf16 agreement
#   long/, titles/     hpd bench on the Qwen3-8B architecture with random bf16 weights: ~500-token
#                      products, 16 attributes, values up to 30 tokens; and title-length products
# Usage, from the repository root:  bash scripts/gpu_session.sh [tests|long|titles|all]  (default all)
#   env: LIMIT=SECONDS (each part's limit), BENCH_ARGS="--repeats 2 --batch-token-budget 262144" (more
#   hpd bench arguments), NUM_PRODUCTS, ARCH, DEVICE, PYTHON
# The working tree that travels to the device is capped at 64 MiB and the adapters alone are
# 190 MB, so before the call, on the CPU machine (docs/gpu-session.md has the whole procedure):
#   python scripts/save_tokenizer.py .gpu/tokenizer       # the benchmarks' tokenizer, ~3.5 MB
#   mkdir -p /tmp/hpd-aside && mv benchmarks/adapters /tmp/hpd-aside/bench-adapters \
#     && mv hpd_core/adapters /tmp/hpd-aside/core-adapters
#   (call the device tool with carry [".gpu"], then move both folders back to where they were)
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT=${OUT:-gpu-out}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
ARCH=${ARCH:-qwen3-8b}
TOKENIZER=${TOKENIZER:-.gpu/tokenizer}
NUM_PRODUCTS=${NUM_PRODUCTS:-64}
BENCH_ARGS=${BENCH_ARGS:-}  # more hpd bench arguments for both workloads, e.g. "--repeats 3"
LIMIT=${LIMIT:-0}  # seconds each part may run (0: no limit), so that one stalled part leaves time for the rest
what=${1:-all}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0

limit() { if (( LIMIT > 0 )); then timeout "$LIMIT" "$@"; else "$@"; fi; }

bench() {  # NAME, then hpd bench's workload arguments
  local name=$1; shift
  echo "== hpd bench $name"
  limit $PY -m jobs.cli bench --synthetic --random-arch "$ARCH" --tokenizer "$TOKENIZER" --dtype bfloat16 \
      --device "$DEVICE" --num-products "$NUM_PRODUCTS" --baseline-docs-per-prompt 1 \
      --out "$OUT/$name" "$@" $BENCH_ARGS 2>&1 | tee "$OUT/$name.log" || status=1
}

{
  nvidia-smi || true
  $PY -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__,
'peft', peft.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [[ $what == all || $what == tests ]]; then
  echo "== pytest -m gpu"
  limit $PY -m pytest -q -m gpu -p no:cacheprovider tests/hpd_core 2>&1 | tee "$OUT/gpu-tests.txt" || status=1
fi
if [[ $what == all || $what == long ]]; then  # the paper's long-product setting
  bench long --product-tokens 500 --attributes-per-product 16 --value-tokens-max 30 --docs-per-prompt 4
fi
if [[ $what == all || $what == titles ]]; then  # OA-Mine-like titles: ~30 tokens, 8 attributes
  bench titles --product-tokens 30 --attributes-per-product 8 --value-tokens-max 10 --docs-per-prompt 6
fi
exit $status
