#!/usr/bin/env bash
# A/B: extract actors with one thread each (the new default: 2 actors on 2 vCPUs) vs one actor with two threads (--max-actors 1)
cd /work/main; . .venv/bin/activate; export RAY_worker_niceness=0
D=work/oa-test; mkdir -p /tmp/ab
run() { # name, args
  local name=$1; shift
  local t0=$(date +%s.%N)
  hpd extract --input $D/records.jsonl --attributes $D/attributes.json --output /tmp/ab/$name --overwrite --chunk-rows 50 "$@" > /tmp/ab/$name.log 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  python - "$name" "$rc" "$t0" "$t1" <<'PY'
import json, sys
name, rc, t0, t1 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
r = json.load(open(f"/tmp/ab/{name}/_report.json"))
keys = ("products_out", "device_seconds", "busy_device_seconds", "products_per_second_per_device", "devices", "extract_actor_processes", "wall_seconds")
print(name, "rc", rc, "wall %.1f" % (t1 - t0), {k: r.get(k) for k in keys}, flush=True)
PY
}
for i in 1 2; do
  run hpd-2x1-$i
  run hpd-1x2-$i --max-actors 1
done
run ar-2x1 --model default-base --adapter benchmarks/adapters/gemma3-270m-oa-mine-ar --decoder ar --docs-per-prompt 1
run ar-1x2 --model default-base --adapter benchmarks/adapters/gemma3-270m-oa-mine-ar --decoder ar --docs-per-prompt 1 --max-actors 1
