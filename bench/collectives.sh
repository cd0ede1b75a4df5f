#!/usr/bin/env bash
# Collective bandwidth of libfsdp2 (ucx) against Open MPI, in the same run.
#
#   bench/collectives.sh [--np "2 4"] [--max BYTES] [--out DIR]
#
# Builds build/ (as ./scripts/demo does), installs Open MPI if missing (the peer only),
# then for each rank count runs bench_collectives under fsdp2run and mpi_collectives
# under mpirun with Open MPI's best configuration here: its UCX pml (Debian disables it
# by default) and glibc malloc told not to give pages back between calls (without that
# its large reduce-scatter is several times slower, which would flatter us). Prints
# busbw side by side with the ratio ours / MPI and writes DIR/collectives.json.
set -euo pipefail
cd "$(dirname "$0")/.."
np_list="2 4"
max=$((256 << 20))
out=bench-results
while [ $# -gt 0 ]; do
    case $1 in
    --np) np_list=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--np \"2 4\"] [--max BYTES] [--out DIR]" >&2; exit 2 ;;
    esac
done
source scripts/deps.sh
fsdp2_install_deps
fsdp2_install_deps openmpi-bin libopenmpi-dev
fsdp2_build build
mkdir -p "$out"
mpicc -O2 -o build/bench/mpi_collectives bench/mpi_collectives.c

mpi_flags=(--allow-run-as-root --oversubscribe --bind-to none
    --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any
    -x MALLOC_MMAP_THRESHOLD_=2147483647 -x MALLOC_TRIM_THRESHOLD_=4294967295
    -x MALLOC_TOP_PAD_=536870912)
for np in $np_list; do
    echo "== $np ranks: libfsdp2"
    build/tools/fsdp2run --nproc-per-node "$np" build/bench/bench_collectives --max "$max" \
        --json "$out/ours_np$np.json"
    echo "== $np ranks: Open MPI (${mpi_flags[*]})"
    mpirun "${mpi_flags[@]}" -np "$np" build/bench/mpi_collectives --max "$max" \
        --json "$out/mpi_np$np.json"
done

python3 - "$out" $np_list <<'PY'
import json, sys
out, nps = sys.argv[1], sys.argv[2:]
summary = []
for np in nps:
    ours = json.load(open(f"{out}/ours_np{np}.json"))
    mpi = json.load(open(f"{out}/mpi_np{np}.json"))
    limit = ours.get("memcpy_gbps", 0)
    print(f"\n{np} ranks (memcpy limit {limit:.2f} GB/s): busbw GB/s")
    print(f"{'op':<15} {'bytes':>11} {'libfsdp2':>9} {'Open MPI':>9} {'ratio':>6}")
    mpi_by = {(r["op"], r["bytes"]): r for r in mpi["results"]}
    for r in ours["results"]:
        m = mpi_by.get((r["op"], r["bytes"]))
        if not m:
            continue
        ratio = r["busbw"] / m["busbw"] if m["busbw"] > 0 else float("inf")
        print(f"{r['op']:<15} {r['bytes']:>11} {r['busbw']:>9.3f} {m['busbw']:>9.3f} {ratio:>6.2f}")
        summary.append({"ranks": int(np), "op": r["op"], "bytes": r["bytes"],
                        "libfsdp2_busbw": r["busbw"], "openmpi_busbw": m["busbw"],
                        "ratio": ratio, "memcpy_gbps": limit})
json.dump({"results": summary}, open(f"{out}/collectives.json", "w"), indent=1)
print(f"\nwrote {out}/collectives.json")
PY
