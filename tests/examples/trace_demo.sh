#!/usr/bin/env bash
# Traces of the Fashion-MNIST example, end to end: --trace over chosen steps at 3 ranks
# (merged through the store at the stop, no part left behind) and FSDP2_TRACE over a whole
# run at 2 ranks; `fsdp2-trace check` accepts both; `fsdp2-trace summary --json` agrees
# with trace_reference.py's independent reading of the events; `fsdp2-trace svg` draws a
# step that rsvg-convert renders.
#   trace_demo.sh FSDP2RUN FASHION_MNIST FSDP2_TRACE_TOOL REFERENCE_PY [RSVG_CONVERT]
set -euo pipefail
run=$1
prog=$2
tool=$3
reference=$4
rsvg=${5:-}
data=/usr/share/datasets/fashion-mnist
if [ ! -d "$data" ]; then
    echo "SKIP: $data is missing (Debian package dataset-fashion-mnist)"
    exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--model mlp --epochs 1 --limit 1920 --seed 5)

"$run" --nproc-per-node 3 "$prog" "${common[@]}" --batch 48 --trace "$out/steps.json" --trace-steps 3:6 \
    >"$out/run3.log"
grep -q "wrote trace $out/steps.json (steps 3..5)" "$out/run3.log"
test -s "$out/steps.json"
if ls "$out"/steps.json.* 2>/dev/null; then
    echo "FAIL: per-rank parts or temporaries left beside the merged trace"
    exit 1
fi
"$tool" check "$out/steps.json"
"$tool" summary --json "$out/steps.json" >"$out/summary.json"
python3 "$reference" "$out/steps.json" "$out/summary.json" 3 3 6
"$tool" summary "$out/steps.json" --step 4 | tee "$out/summary.txt"
grep -q "rank 2 step 4" "$out/summary.txt"

FSDP2_TRACE="$out/whole.json" "$run" --nproc-per-node 2 "$prog" "${common[@]}" --limit 640 \
    >/dev/null
"$tool" check "$out/whole.json"
"$tool" summary --json "$out/whole.json" >"$out/whole_summary.json"
python3 "$reference" "$out/whole.json" "$out/whole_summary.json" 2 1 4

"$tool" svg "$out/steps.json" -o "$out/step.svg" --step 4
grep -q "<svg" "$out/step.svg"
if [ -n "$rsvg" ]; then
    "$rsvg" -o "$out/step.png" "$out/step.svg"
    test -s "$out/step.png"
fi
echo "trace_demo: ok"
