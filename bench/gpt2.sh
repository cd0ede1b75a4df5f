#!/usr/bin/env bash
# GPT-2 training speed: examples/lm (FSDP, f32 and bf16 parameters) against PyTorch
# (bench/peer_gpt2.py: plain at one rank, DDP over gloo at several), PyTorch 2.x in f32 and
# under its CPU bf16 autocast, and Debian's PyTorch 1.13 in f32. The sides alternate, round
# after round, in one invocation, on the same shapes and batch sizes. Prints a table and
# writes JSON.
#
#   bench/gpt2.sh [--presets "small"] [--ws "1 2"] [--steps 6] [--rounds 2] [--batch 8]
#                 [--torch PYTHON] [--sides LIST] [--json FILE]
#
# --sides: which of ours_f32 ours_bf16 torch2_f32 torch2_bf16 torch1_f32 to run (default:
# every one whose PyTorch is found; PyTorch's bf16 autocast is emulated on CPUs without
# bf16 instructions and then takes tens of seconds a step).
# --torch: a python with PyTorch 2.x (default: ~/venv-peers/bin/python when it exists;
# see docs/performance.md for the venv). Threads: the host's cores shared among the ranks
# (at least 1 each), the same for every side, and fsdp2run's OMP_WAIT_POLICY rule for every
# side (docs/launcher.md); PyTorch 1.13 also gets OMP_WAIT_POLICY=PASSIVE and
# OPENBLAS_NUM_THREADS (it computes in OpenBLAS, whose threads otherwise spin against its
# OpenMP pool). Nothing else is set for either side, except for PyTorch 1.13
# when OpenBLAS would pick its generic kernels on an AVX2/AVX-512 CPU: then it gets
# OPENBLAS_CORETYPE (said in the output), or it would be measured on the wrong kernels.
#
# Per run: ms per step (the mean over the steps after the first), tokens/s. Ours also gives
# the GEMMs' GFLOP per step and the time in them; bench_matmul_peak gives the best rate
# oneDNN's matmul reaches here at the step's shapes, so the table shows how far each side
# is from the machine's limit.
set -euo pipefail
cd "$(dirname "$0")/.."
presets="small" wss="1 2" steps=6 rounds=2 json=bench-results/gpt2.json batch=8
torch2="" only=""
[ -x "$HOME/venv-peers/bin/python" ] && torch2=$HOME/venv-peers/bin/python
while [ $# -gt 0 ]; do
    case $1 in
    --presets) presets=$2; shift 2 ;;
    --ws) wss=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --torch) torch2=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --sides) only=$2; shift 2 ;;
    *) echo "usage: $0 [--presets LIST] [--ws LIST] [--steps N] [--rounds R] [--batch B]" \
            "[--torch PYTHON] [--sides LIST] [--json FILE]" >&2; exit 2 ;;
    esac
done
run=./build/tools/fsdp2run lm=./build/examples/lm peak=./build/bench/bench_matmul_peak
[ -x $lm ] || { echo "build first: ninja -C build" >&2; exit 1; }
cores=$(nproc)
sides="ours_f32 ours_bf16"
if [ -n "$torch2" ] && "$torch2" -c 'import torch' 2>/dev/null; then
    sides+=" torch2_f32 torch2_bf16"
    echo "PyTorch 2: $("$torch2" -c 'import torch; print(torch.__version__)') ($torch2)"
else
    echo "PyTorch 2: not found (pass --torch PYTHON); its sides are left out"
fi
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    sides+=" torch1_f32"
    echo "PyTorch 1: $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') (/usr/bin/python3)"
fi
if [ -n "$only" ]; then
    for want in $only; do
        case " $sides " in
        *" $want "*) ;;
        *) echo "--sides: $want is not one of the sides available here: $sides" >&2; exit 2 ;;
        esac
    done
    sides=$only
fi
# what OpenBLAS picks here, for PyTorch 1.13's sake
blas_env=()
core=$(python3 -c 'import ctypes; l = ctypes.CDLL("libopenblas.so.0"); l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())' 2>/dev/null || echo unknown)
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
case "$core" in
Prescott | Core2 | Penryn | Dunnington | Nehalem | Atom | Barcelona | Opteron*)
    case " $flags " in
    *" avx512f "*) blas_env=(OPENBLAS_CORETYPE=SkylakeX) ;;
    *" avx2 "*) blas_env=(OPENBLAS_CORETYPE=Haswell) ;;
    esac ;;
esac
echo "OpenBLAS picks $core kernels here${blas_env:+; PyTorch 1.13 gets ${blas_env[*]}}; $cores cores"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$work/runs.txt"
for round in $(seq "$rounds"); do
    for preset in $presets; do
        for ws in $wss; do
            threads=$(( cores / ws > 0 ? cores / ws : 1 ))
            for side in $sides; do
                out=$work/$preset-$ws-$side-$round.json
                case $side in
                ours_*)
                    dtype=${side#ours_}
                    $run --nproc-per-node "$ws" $lm --preset "$preset" --batch "$batch" \
                        --steps "$steps" --log-every 1 --val-every 0 --warmup 2 \
                        --threads "$threads" --param-dtype "$dtype" --json "$out" \
                        > "$out.log" 2>&1 || { cat "$out.log"; exit 1; } ;;
                torch*)
                    py=$torch2 extra=() env=(OPENBLAS_NUM_THREADS=$threads)
                    [ $side = torch1_f32 ] && py=/usr/bin/python3 \
                        env+=(OMP_WAIT_POLICY=PASSIVE "${blas_env[@]}")
                    [ $side = torch2_bf16 ] && extra=(--autocast-bf16)
                    env "${env[@]}" $run --nproc-per-node "$ws" "$py" bench/peer_gpt2.py --bench \
                        --preset "$preset" --batch "$batch" --steps "$steps" --warmup 2 \
                        --threads "$threads" "${extra[@]}" --json "$out" > "$out.log" 2>&1 ||
                        { cat "$out.log"; exit 1; } ;;
                esac
                echo "$preset $ws $threads $side $round $out" >> "$work/runs.txt"
                echo "  round $round: $preset ws $ws $side done" >&2
            done
        done
    done
done
# oneDNN's best at the forward GEMM shapes of each (preset, ws): M = the rank's tokens
: > "$work/peaks.txt"
for preset in $presets; do
    for ws in $wss; do
        threads=$(( cores / ws > 0 ? cores / ws : 1 ))
        f=$work/$preset-$ws-ours_f32-1.json
        [ -f "$f" ] || continue # (the shapes come from our f32 run)
        shapes=$(python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
m, c, v = d["batch"] // d["ws"] * d["seq"], d["dim"], d["vocab"]
print(" ".join(f"{m}x{n}x{k}" for n, k in [(3 * c, c), (c, c), (4 * c, c), (c, 4 * c), (v, c)]))
PY
)
        if [ -x $peak ]; then
            $peak --threads "$threads" $shapes > "$work/peak-$preset-$ws.json"
            echo "$preset $ws $work/peak-$preset-$ws.json" >> "$work/peaks.txt"
        fi
    done
done
mkdir -p "$(dirname "$json")"
python3 - "$json" "$batch" "$steps" "$work/runs.txt" "$work/peaks.txt" <<'PY'
import json, sys
out = {"batch": int(sys.argv[2]), "steps": int(sys.argv[3]), "runs": [], "peaks": {}}
for line in open(sys.argv[4]):
    preset, ws, threads, side, rnd, path = line.split()
    d = json.load(open(path))
    run = {"preset": preset, "ws": int(ws), "threads_per_rank": int(threads), "side": side,
           "round": int(rnd)}
    if side.startswith("torch"):
        run["ms_per_step"] = d["ms_per_step"]
        seq = {"tiny": 128, "small": 256}.get(preset, 1024)
    else:  # the mean over the steps after the first
        recs = [r for r in d["records"] if r["step"] > 1]
        run["ms_per_step"] = sum(r["ms"] for r in recs) / len(recs)
        run["gemm_ms"] = sum(r["gemm_ms"] for r in recs) / len(recs)
        run["gemm_gflop"] = sum(r["gemm_gflop"] for r in recs) / len(recs)
        seq = d["seq"]
    run["tokens_per_s"] = out["batch"] * seq / (run["ms_per_step"] / 1000)
    out["runs"].append(run)
for line in open(sys.argv[5]):
    preset, ws, path = line.split()
    out["peaks"][f"{preset}-{ws}"] = json.load(open(path))
best = {}
for r in out["runs"]:  # the best round of each side
    key = (r["preset"], r["ws"], r["side"])
    if key not in best or r["ms_per_step"] < best[key]["ms_per_step"]:
        best[key] = r
print("%-7s %3s %3s %-12s %9s %9s %8s %8s %9s" %
      ("preset", "ws", "thr", "side", "ms/step", "tok/s", "GEMM %", "GEMM GF", "GEMM GF/s"))
for (preset, ws, side), r in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    g = ("%7.0f%% %8.1f %9.1f" % (100 * r["gemm_ms"] / r["ms_per_step"], r["gemm_gflop"],
                                   r["gemm_gflop"] / r["gemm_ms"] * 1000)) if "gemm_ms" in r else \
        "%8s %8s %9s" % ("-", "-", "-")
    print("%-7s %3d %3d %-12s %9.1f %9.0f %s" % (preset, ws, r["threads_per_rank"], side,
                                                r["ms_per_step"], r["tokens_per_s"], g))
print()
for preset, ws in sorted({(k[0], k[1]) for k in best}):
    s = {k[2]: v["tokens_per_s"] for k, v in best.items() if k[:2] == (preset, ws)}
    ratios = []
    for a, b in [("ours_f32", "torch2_f32"), ("ours_bf16", "torch2_bf16"),
                 ("ours_bf16", "ours_f32"), ("ours_f32", "torch1_f32")]:
        if a in s and b in s:
            ratios.append("%s/%s %.2fx" % (a, b, s[a] / s[b]))
    pk = out["peaks"].get(f"{preset}-{ws}")
    if pk:
        f32 = [x["f32_gflops"] for x in pk["shapes"]]
        bf = [x["bf16_gflops"] for x in pk["shapes"] if x["bf16_gflops"] > 0]
        ratios.append("oneDNN best here f32 %.0f-%.0f GF/s (%s), bf16 %s" % (
            min(f32), max(f32), pk["shapes"][0]["f32_kernel"],
            "%.0f-%.0f GF/s" % (min(bf), max(bf)) if bf else
            pk["shapes"][0]["bf16_kernel"] + " on this CPU"))
    print("%s ws %d: %s" % (preset, ws, "; ".join(ratios)))
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("wrote", sys.argv[1])
PY
