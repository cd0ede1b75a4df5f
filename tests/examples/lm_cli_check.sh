#!/usr/bin/env bash
# examples/lm's command line:
#   - --grad-accum's unsharded gradient accumulators are in the memory checked before step
#     1: under a limit they do not fit, the run is refused before it (not out of memory
#     inside step 1), and the planned bytes equal the measured peak;
#   - a refused --init-from (a cut safetensors file, a shape that config.json contradicts)
#     or --export (a path that is a file) prints one error line;
#   - --val-every 0 trains on a corpus too short for validation;
#   - --json writes the model's name as a JSON string whatever it holds;
#   - "saved DIR (step N)" reaches the log at once (a killed run's log names its last
#     checkpoint);
#   - --no-shard under bf16 gives FSDP's losses and gradient norms at 2 ranks;
#   - a rank bound to one CPU runs 1 GEMM thread.
# usage: lm_cli_check.sh FSDP2RUN LM TESTS_EXAMPLES_DIR
set -euo pipefail
run=$1 lm=$2 here=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
corpus=$here/gpt2_corpus.txt

# --grad-accum 2 at 2 ranks: 27.52 MiB planned with the accumulators, refused under 26M
rc=0
FSDP2_CPU_MEMORY_LIMIT=26M "$run" --nproc-per-node 2 "$lm" --preset tiny --data "$corpus" \
    --steps 1 --grad-accum 2 >"$work/accum.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "--grad-accum 2 under 26M ran"
grep -q "Refused before step 1" "$work/accum.log" || { cat "$work/accum.log"; fail "not refused before step 1"; }
! grep -q "out of memory" "$work/accum.log" || { cat "$work/accum.log"; fail "ran out of memory"; }
"$run" --nproc-per-node 2 "$lm" --preset tiny --data "$corpus" --steps 2 --grad-accum 2 \
    --json "$work/accum.json" >"$work/accum2.log" 2>&1 || { cat "$work/accum2.log"; fail "--grad-accum 2"; }
python3 - "$work/accum.json" <<'PY' || fail "--grad-accum 2: planned != peak"
import json, sys
for r in json.load(open(sys.argv[1]))["records"]:
    assert r["planned_bytes"] == r["peak_bytes"], r
    print("--grad-accum 2: planned = peak =", r["peak_bytes"], "bytes")
PY

# refusals: one line each
one_error() { # one_error NAME ARGS...
    local name=$1 rc=0
    shift
    "$lm" "$@" >"$work/out" 2>"$work/err" || rc=$?
    [ "$rc" != 0 ] || fail "$name: accepted"
    local lines
    lines=$(grep -c . "$work/err" || true)
    [ "$lines" = 1 ] || { cat "$work/err"; fail "$name: $lines lines of errors, want 1"; }
    echo "$name: $(cat "$work/err")"
}
cp -r "$here/lm-init/llama" "$work/cut"
truncate -s 5000 "$work/cut/model.safetensors"
one_error "--init-from a cut file" --init-from "$work/cut" --data "$corpus" --steps 1
cp -r "$here/lm-init/llama" "$work/shape"
sed -i 's/"intermediate_size": 64/"intermediate_size": 48/' "$work/shape/config.json"
grep -q '"intermediate_size": 48' "$work/shape/config.json" || fail "the shape fixture"
one_error "--init-from a shape mismatch" --init-from "$work/shape" --data "$corpus" --steps 1
touch "$work/afile"
one_error "--export to a file" --preset tiny --data "$corpus" --steps 0 --export "$work/afile"

# --val-every 0: 400 bytes hold no validation window of 128 + 2
head -c 400 "$corpus" >"$work/short.txt"
rc=0
"$lm" --preset tiny --data "$work/short.txt" --steps 1 >"$work/short.log" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q "validation text" "$work/short.log" || fail "a short corpus was not refused"
"$lm" --preset tiny --data "$work/short.txt" --steps 1 --val-every 0 --seq-len 64 \
    >"$work/noval.log" 2>&1 || { cat "$work/noval.log"; fail "--val-every 0 demanded validation text"; }
echo "--val-every 0: trains on 400 bytes"

# --json: a model directory whose name holds a quote, a backslash and a tab
odd="$work/a\"b\\c	d"
cp -r "$here/lm-init/llama" "$odd"
"$lm" --init-from "$odd" --data "$corpus" --steps 1 --seq-len 32 --json "$work/odd.json" \
    >"$work/odd.log" 2>&1 || { cat "$work/odd.log"; fail "--init-from $odd"; }
python3 - "$work/odd.json" "$odd" <<'PY' || fail "--json: the preset is not the directory's name"
import json, sys
got = json.load(open(sys.argv[1]))["preset"]
assert got == sys.argv[2], (got, sys.argv[2])
print("--json: preset", json.dumps(got))
PY

# "saved" is in the log as soon as the checkpoint is (stdout is a file: block-buffered)
"$lm" --preset tiny --data "$corpus" --steps 100000 --seq-len 32 --batch 2 --save-every 1 \
    --log-every 100000 --val-every 0 --save "$work/ckpt" >"$work/save.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    grep -q "^saved .* (step 2)" "$work/save.log" && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/save.log"; fail "the --save run ended"; }
    sleep 0.1
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
grep -q "^saved .* (step 2)" "$work/save.log" || { cat "$work/save.log"; fail "no saved line after 60 s"; }
echo "--save: the saved lines reach the log at once"

# --no-shard (a [2, 1] mesh) reduces bf16 gradients in f32 as FSDP does: the same losses
# and gradient norms, to the digits --json writes
for layout in fsdp no-shard; do
    flag=()
    [ "$layout" = fsdp ] || flag=(--no-shard)
    "$run" --nproc-per-node 2 "$lm" --preset tiny --data "$corpus" --steps 3 --log-every 1 \
        --val-every 0 --param-dtype bf16 "${flag[@]}" --json "$work/$layout.json" \
        >"$work/$layout.log" 2>&1 || { cat "$work/$layout.log"; fail "bf16 $layout"; }
done
python3 - "$work/fsdp.json" "$work/no-shard.json" <<'PY' || fail "--no-shard differs from FSDP under bf16"
import json, sys
fsdp, ddp = ([(r["train_loss"], r["grad_norm"]) for r in json.load(open(p))["records"]]
             for p in sys.argv[1:])
assert len(fsdp) == 3 and fsdp == ddp, (fsdp, ddp)
print("--no-shard under bf16: the losses and norms of FSDP", ddp)
PY

# GEMM threads: a rank bound to fewer CPUs than are online (as a launcher binds it) uses
# those, not the online CPUs' share
online=$(getconf _NPROCESSORS_ONLN)
if command -v taskset >/dev/null && [ "$online" -gt 1 ]; then
    cpu=$(taskset -cp $$ | sed 's/.*: //; s/[-,].*//')
    taskset -c "$cpu" "$lm" --preset tiny --data "$corpus" --steps 0 --val-every 0 \
        >"$work/bound.log" 2>&1 || { cat "$work/bound.log"; fail "bound to CPU $cpu"; }
    grep -q ", 1 GEMM thread per rank" "$work/bound.log" ||
        { head -1 "$work/bound.log"; fail "bound to 1 of $online CPUs: not 1 GEMM thread"; }
    echo "bound to CPU $cpu of $online: 1 GEMM thread"
else
    echo "GEMM threads of a bound rank: skipped (no taskset, or 1 CPU online)"
fi
