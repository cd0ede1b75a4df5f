#!/usr/bin/env bash
# LoRA against full fine-tuning of the same model with examples/lm, alternating in one
# invocation: memory per rank (parameters + gradients + optimizer state, FSDP's buffers,
# activations; planned and measured) and ms per step. Prints a table and writes JSON.
#
#   bench/lora.sh [--preset llama-small] [--ws 2] [--steps 6] [--rounds 2]
#                 [--lora r=8,alpha=16,targets=q_proj,k_proj,v_proj,o_proj] [--json FILE]
#
# As a user runs it: no environment variable is set. The ms per step are the mean over
# the steps after the first of each run; each round runs both, full first then LoRA.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=llama-small ws=2 steps=6 rounds=2 json=bench-results/lora.json
lora=r=8,alpha=16,targets=q_proj,k_proj,v_proj,o_proj
while [ $# -gt 0 ]; do
    case $1 in
    --preset) preset=$2; shift 2 ;;
    --ws) ws=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --lora) lora=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "usage: $0 [--preset P] [--ws N] [--steps N] [--rounds N] [--lora SPEC] [--json F]" >&2
       exit 2 ;;
    esac
done
run=./build/tools/fsdp2run lm=./build/examples/lm
[ -x $lm ] || { echo "build first: ninja -C build" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for round in $(seq "$rounds"); do
    for mode in full lora; do
        extra=()
        [ "$mode" = lora ] && extra=(--lora "$lora")
        "$run" --nproc-per-node "$ws" "$lm" --preset "$preset" --steps "$steps" \
            --log-every 1 --val-every 0 --json "$work/$mode-$round.json" "${extra[@]}" \
            > "$work/$mode-$round.log" 2>&1 || { cat "$work/$mode-$round.log"; exit 1; }
    done
done
mkdir -p "$(dirname "$json")"
python3 - "$work" "$rounds" "$json" "$preset" "$ws" "$lora" <<'PY'
import json, statistics, sys
work, rounds, out, preset, ws, lora = sys.argv[1], int(sys.argv[2]), sys.argv[3], *sys.argv[4:]
rows = {}
for mode in ("full", "lora"):
    ms, mem = [], None
    for r in range(1, rounds + 1):
        recs = json.load(open(f"{work}/{mode}-{r}.json"))["records"]
        ms += [x["ms"] for x in recs[1:]]
        mem = recs[-1]
    rows[mode] = {"ms_per_step": statistics.median(ms), "ms_all": ms,
                  "state_mib": mem["state_bytes"] / 2**20, "fsdp_mib": mem["fsdp_bytes"] / 2**20,
                  "activations_mib": mem["activation_bytes"] / 2**20,
                  "planned_mib": mem["planned_bytes"] / 2**20, "peak_mib": mem["peak_bytes"] / 2**20}
print(f"{preset} at ws {ws}, LoRA {lora}; ms per step: median over {rounds} alternating rounds")
print(f"{'':6} {'ms/step':>9} {'params+grads+opt':>17} {'FSDP buffers':>13} {'activations':>12} "
      f"{'planned':>9} {'peak':>9}  (MiB per rank)")
for mode, r in rows.items():
    print(f"{mode:6} {r['ms_per_step']:9.1f} {r['state_mib']:17.2f} {r['fsdp_mib']:13.2f} "
          f"{r['activations_mib']:12.2f} {r['planned_mib']:9.2f} {r['peak_mib']:9.2f}")
f, l = rows["full"], rows["lora"]
print(f"LoRA / full: {l['ms_per_step'] / f['ms_per_step']:.2f}x the time, "
      f"{l['peak_mib'] / f['peak_mib']:.2f}x the peak memory")
json.dump({"preset": preset, "ws": ws, "lora": lora, "rows": rows}, open(out, "w"), indent=1)
PY
