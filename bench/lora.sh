#!/usr/bin/env bash
# LoRA against full fine-tuning of the same model with examples/lm, alternating in one
# invocation: memory per rank (parameters + gradients + optimizer state, FSDP's buffers,
# activations; planned and measured) and ms per step. With --peer, the same two runs in
# Hugging Face transformers and PEFT on PyTorch 2.x (bench/peer_lora.py: the example's
# own export of the model, plain at one rank, DDP over gloo at several), alternating with
# ours in each round, and the ratios. Prints a table and writes JSON.
#
#   bench/lora.sh [--preset llama-small] [--ws 2] [--steps 6] [--rounds 2] [--batch 8]
#                 [--lora r=8,alpha=16,targets=q_proj,k_proj,v_proj,o_proj]
#                 [--peer] [--torch PYTHON] [--json FILE]
#
# As a user runs it: no environment variable is set. Threads per rank: the host's cores
# shared among the ranks, the same for every side. The ms per step are the median over
# the steps after the first of each run; each round runs ours full, ours LoRA, then (with
# --peer) theirs full and theirs LoRA. --torch: a python with torch, transformers and peft
# (default ~/venv-peers/bin/python; see docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=llama-small ws=2 steps=6 rounds=2 batch=8 json=bench-results/lora.json
lora=r=8,alpha=16,targets=q_proj,k_proj,v_proj,o_proj peer=0 torch=$HOME/venv-peers/bin/python
while [ $# -gt 0 ]; do
    case $1 in
    --preset) preset=$2; shift 2 ;;
    --ws) ws=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --lora) lora=$2; shift 2 ;;
    --peer) peer=1; shift ;;
    --torch) torch=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "usage: $0 [--preset P] [--ws N] [--steps N] [--rounds N] [--batch B] [--lora SPEC]" \
            "[--peer] [--torch PYTHON] [--json F]" >&2
       exit 2 ;;
    esac
done
run=./build/tools/fsdp2run lm=./build/examples/lm
[ -x $lm ] || { echo "build first: ninja -C build" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
threads=$(( $(nproc) / ws > 0 ? $(nproc) / ws : 1 ))
modes="full lora"
if [ "$peer" = 1 ]; then
    "$torch" -c 'import torch, transformers, peft' 2>/dev/null ||
        { echo "--peer: $torch has no torch, transformers or peft (pass --torch PYTHON)" >&2; exit 1; }
    modes+=" theirs_full theirs_lora"
    "$lm" --preset "$preset" --steps 0 --export "$work/base" > "$work/export.log" 2>&1 ||
        { cat "$work/export.log"; exit 1; }
fi
for round in $(seq "$rounds"); do
    for mode in $modes; do
        out=$work/$mode-$round
        case $mode in
        full | lora)
            extra=()
            [ "$mode" = lora ] && extra=(--lora "$lora")
            "$run" --nproc-per-node "$ws" "$lm" --preset "$preset" --steps "$steps" \
                --batch "$batch" --threads "$threads" --log-every 1 --val-every 0 \
                --json "$out.json" "${extra[@]}" > "$out.log" 2>&1 || { cat "$out.log"; exit 1; } ;;
        theirs_*)
            extra=()
            [ "$mode" = theirs_lora ] && extra=(--lora "$lora")
            "$run" --nproc-per-node "$ws" "$torch" bench/peer_lora.py --model "$work/base" \
                --steps "$steps" --batch "$batch" --threads "$threads" --json "$out.json" \
                "${extra[@]}" > "$out.log" 2>&1 || { cat "$out.log"; exit 1; } ;;
        esac
        echo "  round $round: $mode done"
    done
done
mkdir -p "$(dirname "$json")"
python3 - "$work" "$rounds" "$json" "$preset" "$ws" "$lora" $modes <<'PY'
import json, statistics, sys
work, rounds, out, preset, ws, lora, *modes = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
rows = {}
for mode in modes:
    ms, last = [], None
    for r in range(1, rounds + 1):
        recs = json.load(open(f"{work}/{mode}-{r}.json"))["records"]
        ms += [x["ms"] for x in recs[1:]]
        last = recs[-1]
    row = {"ms_per_step": statistics.median(ms), "ms_all": ms}
    if "state_bytes" in last:  # ours: the plan and the allocator's peak
        row.update({"state_mib": last["state_bytes"] / 2**20,
                    "fsdp_mib": last["fsdp_bytes"] / 2**20,
                    "activations_mib": last["activation_bytes"] / 2**20,
                    "planned_mib": last["planned_bytes"] / 2**20,
                    "peak_mib": last["peak_bytes"] / 2**20})
    rows[mode] = row
print(f"{preset} at ws {ws}, LoRA {lora}; ms per step: median over {rounds} alternating rounds")
print(f"{'':12} {'ms/step':>9} {'params+grads+opt':>17} {'FSDP buffers':>13} {'activations':>12} "
      f"{'planned':>9} {'peak':>9}  (MiB per rank)")
for mode, r in rows.items():
    mem = (f"{r['state_mib']:17.2f} {r['fsdp_mib']:13.2f} {r['activations_mib']:12.2f} "
           f"{r['planned_mib']:9.2f} {r['peak_mib']:9.2f}" if "state_mib" in r else
           f"{'-':>17} {'-':>13} {'-':>12} {'-':>9} {'-':>9}")
    print(f"{mode:12} {r['ms_per_step']:9.1f} {mem}")
f, l = rows["full"], rows["lora"]
print(f"LoRA / full: {l['ms_per_step'] / f['ms_per_step']:.2f}x the time, "
      f"{l['peak_mib'] / f['peak_mib']:.2f}x the peak memory")
ratios = {}
for ours, theirs in (("full", "theirs_full"), ("lora", "theirs_lora")):
    if theirs in rows:
        ratios[ours] = rows[theirs]["ms_per_step"] / rows[ours]["ms_per_step"]
        print(f"{ours}: ours {ratios[ours]:.2f}x the speed of transformers"
              f"{' + peft' if ours == 'lora' else ''} (their ms / ours)")
with open(out, "w") as fo:
    json.dump({"preset": preset, "ws": ws, "lora": lora, "rows": rows,
               "speed_vs_theirs": ratios}, fo, indent=1)
PY
