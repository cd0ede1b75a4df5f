#!/usr/bin/env bash
# A few training steps of the Fashion-MNIST example at ws = 1 and ws = 2 (FSDP), at
# ws = 2 replicated (--no-shard), at ws = 4 with reshard_after_forward 2, at ws = 4 with
# blocking cpu streams (FSDP2_CPU_STREAM_BLOCKING=on) and reshard_after_forward false,
# as HSDP on two "nodes" of 2 ranks (two fsdp2run instances on loopback: a [2, 2] mesh),
# and stopped at ws = 4 after one epoch with a checkpoint then resumed at ws = 2, must
# reach the same losses: each step's global batch is the same 64 samples whatever the
# world size, and the gradients are averaged.
#   same_loss.sh FSDP2RUN FASHION_MNIST
set -euo pipefail
run=$1
prog=$2
data=/usr/share/datasets/fashion-mnist
if [ ! -d "$data" ]; then
    echo "SKIP: $data is missing (Debian package dataset-fashion-mnist)"
    exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--model mlp --epochs 2 --limit 1280 --seed 3)
"$run" --nproc-per-node 1 "$prog" "${common[@]}" --json "$out/ws1.json" >/dev/null
"$run" --nproc-per-node 2 "$prog" "${common[@]}" --json "$out/ws2.json" >/dev/null
"$run" --nproc-per-node 2 "$prog" "${common[@]}" --no-shard --json "$out/ddp2.json" >/dev/null
# Mixed precision (bf16 compute, f32 reduction): close to f32, not equal.
"$run" --nproc-per-node 2 "$prog" "${common[@]}" --param-dtype bf16 --json "$out/bf16.json" >/dev/null
"$run" --nproc-per-node 4 "$prog" "${common[@]}" --reshard-after-forward 2 --json "$out/rs2.json" >/dev/null
# Every side-stream task run before its enqueue returns (a debugging mode): same math;
# parameters kept unsharded from forward to backward (the other runs reshard them).
FSDP2_CPU_STREAM_BLOCKING=on "$run" --nproc-per-node 4 "$prog" "${common[@]}" \
    --reshard-after-forward 0 --json "$out/blocking4.json" >/dev/null
# HSDP: shard within each "node", replicate across the two.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for node in 0 1; do
    json=()
    if [ "$node" = 0 ]; then json=(--json "$out/hsdp.json"); fi
    "$run" --nnodes 2 --node-rank "$node" --nproc-per-node 2 --master-addr 127.0.0.1 \
        --master-port "$port" "$prog" "${common[@]}" --hsdp "${json[@]}" >"$out/hsdp$node.log" 2>&1 &
done
status=0
wait %1 || status=$?
wait %2 || status=$?
if [ "$status" -ne 0 ]; then
    cat "$out"/hsdp*.log
    echo "FAIL: HSDP on two nodes exited $status"
    exit 1
fi
grep -h "HSDP \[2 replicas, 2 shards\]" "$out/hsdp0.log"
# Stop after one epoch at ws 4 with a checkpoint, resume at ws 2 for the second.
"$run" --nproc-per-node 4 "$prog" "${common[@]}" --epochs 1 --save "$out/ckpt" >/dev/null
"$run" --nproc-per-node 2 "$prog" "${common[@]}" --resume "$out/ckpt" --json "$out/resumed.json" >/dev/null
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {name: json.load(open(f"{out}/{name}.json")) for name in ("ws1", "ws2", "ddp2", "rs2", "blocking4", "hsdp", "resumed")}
bad = 0
if len(runs["resumed"]["epochs"]) != 1 or runs["resumed"]["epochs"][0]["epoch"] != 2:
    print("FAIL: the resumed run should have trained epoch 2 only:", runs["resumed"]["epochs"])
    bad += 1
for name in ("ws2", "ddp2", "rs2", "blocking4", "hsdp", "resumed"):
    by_epoch = {e["epoch"]: e for e in runs[name]["epochs"]}
    for a in runs["ws1"]["epochs"]:
        b = by_epoch.get(a["epoch"])
        if b is None:
            continue
        for key in ("train_loss", "test_loss"):
            x, y = a[key], b[key]
            if abs(x - y) > 1e-4 * max(1.0, abs(x)):
                print(f"FAIL epoch {a['epoch']} {key}: ws1 {x} vs {name} {y}")
                bad += 1
            else:
                print(f"ok   epoch {a['epoch']} {key}: ws1 {x} {name} {y}")
bf16 = json.load(open(f"{out}/bf16.json"))["epochs"]
for a, b in zip(runs["ws1"]["epochs"], bf16):
    x, y = a["train_loss"], b["train_loss"]
    ok = abs(x - y) <= 0.03 * abs(x)
    print(f"{'ok  ' if ok else 'FAIL'} epoch {a['epoch']} train_loss: f32 {x} bf16 {y} (within 3%)")
    bad += not ok
sys.exit(1 if bad else 0)
PY
