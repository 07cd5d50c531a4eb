#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the extraction job on the shipped OA-Mine sample with the
# embedded default model on CPU (local Ray, local files). Extra arguments go to `hpd extract`,
# e.g. --limit 8 or --decoder ar. Output: runs/quickstart/ (override with HPD_QUICKSTART_OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
out=${HPD_QUICKSTART_OUT:-runs/quickstart}
hpd extract --input samples/oa-mine-sample.jsonl --attributes samples/attributes.json --output "$out" "$@"
echo
echo "attribute values: $out/attributes/   (Parquet, one folder per category)"
echo "rejected rows:    $out/rejected/"
echo "report:           $out/_report.md and $out/_report.json"
