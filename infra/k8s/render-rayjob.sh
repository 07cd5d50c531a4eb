#!/usr/bin/env bash
# Render the RayJob template (rayjob.yaml) for one run date and print it on stdout.
#
# Parameters (environment):
#   HPD_INPUT_PREFIX   s3://bucket/prefix/ holding dt=YYYY-MM-DD/ input folders   (required)
#   HPD_OUTPUT_PREFIX  s3://bucket/prefix/ receiving dt=YYYY-MM-DD/ outputs        (required)
#   HPD_MODEL          --model value: s3://bucket/prefix/, hub id or path          (required)
#   HPD_RUN_DATE       YYYY-MM-DD                                    (default: yesterday, UTC)
# Argument: the template path (default: rayjob.yaml next to this script).
#
#   HPD_INPUT_PREFIX=s3://<your-bucket>/records/ HPD_OUTPUT_PREFIX=s3://<your-bucket>/attributes/ \
#   HPD_MODEL=s3://<your-bucket>/models/<model>/ HPD_RUN_DATE=2026-11-20 \
#   infra/k8s/render-rayjob.sh | kubectl create -f -
#
# The nightly CronJob (backfill-cronjob.yaml) runs this same script from a ConfigMap.
set -euo pipefail

template="${1:-$(dirname "$0")/rayjob.yaml}"

fail() {
    echo "render-rayjob.sh: $*" >&2
    exit 2
}

# Yesterday in UTC: GNU date first, then BSD/macOS date.
yesterday() {
    date -u -d yesterday +%F 2>/dev/null || date -u -v-1d +%F
}

run_date="${HPD_RUN_DATE:-$(yesterday)}"
input_prefix="${HPD_INPUT_PREFIX:-}"
output_prefix="${HPD_OUTPUT_PREFIX:-}"
model="${HPD_MODEL:-}"

[[ -r "$template" ]] || fail "template not readable: $template"
[[ "$run_date" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] || fail "HPD_RUN_DATE must be YYYY-MM-DD, got '$run_date'"
for name in HPD_INPUT_PREFIX HPD_OUTPUT_PREFIX; do
    value="${!name:-}"
    [[ "$value" =~ ^s3://[^/]+/(.*/)?$ ]] || fail "$name must be an s3:// prefix ending in '/', got '$value'"
done
[[ -n "$model" ]] || fail "HPD_MODEL is required (s3://bucket/prefix/, hub id or local path)"
# The values end up in a shell command line (the RayJob entrypoint) and in sed replacements:
# allow only characters that need no quoting in either.
for value in "$input_prefix" "$output_prefix" "$model"; do
    [[ "$value" =~ ^[A-Za-z0-9._~:/=+@-]+$ ]] || fail "unsupported character in '$value'"
done

rendered="$(
    sed -e '/^#/d' \
        -e "s|{{HPD_RUN_DATE}}|${run_date}|g" \
        -e "s|{{HPD_INPUT_PREFIX}}|${input_prefix}|g" \
        -e "s|{{HPD_OUTPUT_PREFIX}}|${output_prefix}|g" \
        -e "s|{{HPD_MODEL}}|${model}|g" \
        "$template"
)"
if grep -q '{{' <<<"$rendered"; then
    fail "template has a parameter this script does not know: $(grep -o '{{[^}]*}}' <<<"$rendered" | sort -u | tr '\n' ' ')"
fi
printf '%s\n' "$rendered"
