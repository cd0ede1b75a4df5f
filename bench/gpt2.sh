#!/usr/bin/env bash
# GPT-2 training speed: examples/lm (FSDP and --no-shard) against PyTorch (plain at one
# rank, DDP over gloo at several: bench/peer_gpt2.py), alternating in one invocation, on
# the same shapes and batches of the same size. Prints a table and writes JSON.
#
#   bench/gpt2.sh [--presets "tiny small"] [--ws "1 2 4"] [--steps 8] [--json FILE]
#
# Threads: the host's cores shared among the ranks (at least 1 each) for both sides;
# PyTorch gets OMP_WAIT_POLICY=PASSIVE and OPENBLAS_NUM_THREADS too (Debian's torch runs
# its GEMMs in OpenBLAS, whose threads otherwise spin against its OpenMP pool). Both run
# their GEMMs in the same OpenBLAS, with OPENBLAS_CORETYPE set from the CPU's flags when
# unset (SkylakeX with AVX-512, Haswell with AVX2): a virtual machine that hides its CPU
# model makes OpenBLAS fall back to its SSE3 kernels. The ms per step are the mean over
# the steps after the first.
set -euo pipefail
cd "$(dirname "$0")/.."
presets="tiny small" wss="1 2 4" steps=8 json=bench-gpt2.json batch=8
while [ $# -gt 0 ]; do
    case $1 in
    --presets) presets=$2; shift 2 ;;
    --ws) wss=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "usage: $0 [--presets LIST] [--ws LIST] [--steps N] [--batch B] [--json FILE]" >&2; exit 2 ;;
    esac
done
run=./build/tools/fsdp2run gpt2=./build/examples/lm
[ -x $gpt2 ] || { echo "build first: ninja -C build" >&2; exit 1; }
cores=$(nproc)
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    cpuflags=$(grep -m1 '^flags' /proc/cpuinfo || true)
    case " $cpuflags " in
    *" avx512f "*) export OPENBLAS_CORETYPE=SkylakeX ;;
    *" avx2 "*) export OPENBLAS_CORETYPE=Haswell ;;
    esac
fi
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, $cores cores"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=()
for preset in $presets; do
    for ws in $wss; do
        threads=$(( cores / ws > 0 ? cores / ws : 1 ))
        for side in fsdp no_shard torch; do
            out=$work/$preset-$ws-$side.json
            case $side in
            fsdp | no_shard)
                flags=(--preset "$preset" --batch "$batch" --steps "$steps" --log-every 1
                       --val-every 0 --warmup 2 --threads "$threads" --json "$out")
                [ $side = no_shard ] && flags+=(--no-shard)
                $run --nproc-per-node "$ws" $gpt2 "${flags[@]}" > "$out.log" 2>&1 ||
                    { cat "$out.log"; exit 1; } ;;
            torch)
                OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=$threads \
                    $run --nproc-per-node "$ws" /usr/bin/python3 bench/peer_gpt2.py --bench \
                    --preset "$preset" --batch "$batch" --steps "$steps" --warmup 2 \
                    --threads "$threads" --json "$out" > "$out.log" 2>&1 ||
                    { cat "$out.log"; exit 1; } ;;
            esac
            results+=("$preset $ws $threads $side $out")
        done
    done
done
printf '%s\n' "${results[@]}" > "$work/runs.txt"
python3 - "$json" "$batch" "$steps" "$work/runs.txt" <<'PY'
import json, sys
out = {"batch": int(sys.argv[2]), "steps": int(sys.argv[3]), "runs": []}
for line in open(sys.argv[4]):
    preset, ws, threads, side, path = line.split()
    d = json.load(open(path))
    if side == "torch":
        ms = d["ms_per_step"]
    else:  # the mean over the steps after the first
        recs = [r for r in d["records"] if r["step"] > 1]
        ms = sum(r["ms"] for r in recs) / len(recs)
    seq = {"tiny": 128, "small": 256}.get(preset, 1024)
    out["runs"].append({"preset": preset, "ws": int(ws), "threads_per_rank": int(threads),
                        "side": side, "ms_per_step": ms,
                        "tokens_per_s": out["batch"] * seq / (ms / 1000)})
head = ("preset", "ws", "thr", "fsdp ms", "ddp-style ms", "torch ms", "fsdp tok/s", "torch tok/s",
        "fsdp speedup")
print("%-8s %3s %3s %9s %13s %9s %11s %12s %12s" % head)
by = {}
for r in out["runs"]:
    by.setdefault((r["preset"], r["ws"], r["threads_per_rank"]), {})[r["side"]] = r
for (preset, ws, thr), s in by.items():
    f, n, t = s["fsdp"], s["no_shard"], s["torch"]
    print("%-8s %3d %3d %9.1f %13.1f %9.1f %11.0f %12.0f %11.2fx" %
          (preset, ws, thr, f["ms_per_step"], n["ms_per_step"], t["ms_per_step"],
           f["tokens_per_s"], t["tokens_per_s"], t["ms_per_step"] / f["ms_per_step"]))
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("wrote", sys.argv[1])
PY
