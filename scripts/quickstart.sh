#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the extraction job on the shipped OA-Mine sample with the
# embedded default model on CPU (local Ray, local files). Extra arguments go to `hpd extract`,
# e.g. --limit 8 or --decoder ar. Output: runs/quickstart/ without arguments; with arguments a folder
# named after them (runs/quickstart-limit-8/), since different arguments are a different job and
# `hpd extract` refuses to mix two jobs in one folder. HPD_QUICKSTART_OUT replaces runs/quickstart.
# Running the same command again resumes an interrupted run, or does nothing if it finished. It
# ends with the values of two products (scripts/show_values.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${HPD_QUICKSTART_SETUP:-1}" = 1 ]; then  # 0: use the hpd already on PATH (the tests do)
  bash scripts/setup.sh
  . .venv/bin/activate
fi
out=${HPD_QUICKSTART_OUT:-runs/quickstart}
for arg in "$@"; do
  case "$arg" in
    --overwrite|--verbose) ;;  # not part of the job
    *) out="$out-$(printf '%s' "$arg" | tr -cs 'A-Za-z0-9.' '-' | sed 's/^-*//; s/-*$//')" ;;
  esac
done
hpd extract --input samples/oa-mine-sample.jsonl --attributes samples/attributes.json --output "$out" "$@"
if [ -d "$out/attributes" ]; then  # a first look at what was extracted; never the script's exit code
  echo
  py=$(dirname "$(readlink -f "$(command -v hpd)")")/python  # the environment hpd runs in
  [ -x "$py" ] || py=python3
  "$py" scripts/show_values.py "$out" --input samples/oa-mine-sample.jsonl --products 2 \
    || echo "(the values could not be shown; they are in $out/attributes/)" >&2
fi
