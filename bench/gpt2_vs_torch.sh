#!/usr/bin/env bash
# examples/lm against PyTorch on the same initial weights and batches: the first
# --steps training losses at ws 1, 2 and 4 in f32 (and, with --bf16, ours with bf16
# parameters against PyTorch's f32 and its own bf16 autocast), as the largest relative
# difference per run. PyTorch: bench/peer_gpt2.py (Debian's python3-torch).
#
#   bench/gpt2_vs_torch.sh [--preset tiny] [--steps 20] [--bf16]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=tiny steps=20 bf16=0
while [ $# -gt 0 ]; do
    case $1 in
    --preset) preset=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bf16) bf16=1; shift ;;
    *) echo "usage: $0 [--preset NAME] [--steps N] [--bf16]" >&2; exit 2 ;;
    esac
done
gpt2=$PWD/build/examples/lm run=$PWD/build/tools/fsdp2run peer=$PWD/bench/peer_gpt2.py
[ -x "$gpt2" ] || { echo "build first: ninja -C build" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
common=(--preset "$preset" --log-every 1 --val-every 0)
"$gpt2" "${common[@]}" --steps 0 --export init > /dev/null
mv init/model.safetensors init.safetensors
"$gpt2" "${common[@]}" --steps "$steps" --json ws1.json --dump-batches batches > /dev/null
for ws in 2 4; do
    "$run" --nproc-per-node $ws "$gpt2" "${common[@]}" --steps "$steps" --json ws$ws.json > /dev/null
done
export OMP_WAIT_POLICY=PASSIVE
/usr/bin/python3 "$peer" --preset "$preset" --init init.safetensors --batches batches.0 \
    --steps "$steps" --json torch.json > /dev/null
runs=(ws1 ws2 ws4)
if [ $bf16 = 1 ]; then
    "$gpt2" "${common[@]}" --steps "$steps" --param-dtype bf16 --json bf16.json > /dev/null
    /usr/bin/python3 "$peer" --preset "$preset" --init init.safetensors --batches batches.0 \
        --steps "$steps" --autocast-bf16 --json torch-bf16.json > /dev/null
    runs+=(bf16 torch-bf16)
fi
python3 - "${runs[@]}" <<'PY'
import json, sys
want = [r["train_loss"] for r in json.load(open("torch.json"))["records"]]
for run in sys.argv[1:]:
    got = [r["train_loss"] for r in json.load(open(run + ".json"))["records"]]
    worst = max(abs(g - w) / abs(w) for g, w in zip(got, want))
    print(f"{run:11s} against PyTorch f32: {len(got)} steps, largest relative difference {worst:.2e}"
          f" (loss {got[0]:.6f} -> {got[-1]:.6f})")
PY
