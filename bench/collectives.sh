#!/usr/bin/env bash
# Collective bandwidth of libfsdp2 (ucx) against Open MPI, in the same run.
#
#   bench/collectives.sh [--np "2 4"] [--max BYTES] [--repeat R] [--pairs K] [--out DIR]
#
# Builds build/ (as ./scripts/demo does), installs Open MPI if missing (the peer only),
# then for each rank count runs bench_collectives under fsdp2run and mpi_collectives
# under mpirun with Open MPI's best configuration here (bench/mpi_flags.sh): its UCX pml
# (Debian disables it by default) and glibc malloc told not to give pages back between
# calls (without that its large reduce-scatter is several times slower, which would
# flatter us). Prints
# busbw side by side with the ratio ours / MPI and ours as a share of one thread's
# memcpy rate (the limit), reduce-scatters from 64 MiB also as a share of what reading
# their inputs allows (all ranks read at once, as bench_collectives measures), and
# writes DIR/collectives.json. The all-gathers and
# reduce-scatters run out of place and in place, as nccl-tests times them
# (bench/coll_ops.h).
# --repeat R runs the pair R times, alternating ours and MPI, and reports each cell's
# median over the R runs (with its range): this machine's speed moves by 2-5x between
# runs of the same program, so single runs decide little below 1 MiB.
# Then, for each rank count, bench/interleaved.c runs both implementations in the same
# processes under mpirun, alternating blocks of calls K times per cell (--pairs, default
# 15), once with our collectives on a side stream (synchronized after each call, as
# when FSDP must wait for one) and once inline on the calling thread (blocking, as
# MPI's calls are); its ratio is the median over pairs, which the host's slow phases
# hit on both sides. With more ranks than CPUs both are bound as fsdp2run --bind auto
# binds ours (fsdp2run --bind core inside mpirun).
set -euo pipefail
cd "$(dirname "$0")/.."
np_list="2 4"
max=$((256 << 20))
repeat=1
pairs=15
out=bench-results
while [ $# -gt 0 ]; do
    case $1 in
    --np) np_list=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2
        if ! [[ $repeat =~ ^[1-9][0-9]*$ ]]; then echo "--repeat $repeat: want a count >= 1" >&2; exit 2; fi ;;
    --pairs) pairs=$2; shift 2
        if ! [[ $pairs =~ ^[1-9][0-9]?$ ]] || [ "$pairs" -gt 64 ]; then
            echo "--pairs $pairs: want 1..64" >&2; exit 2
        fi ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--np \"2 4\"] [--max BYTES] [--repeat R] [--pairs K] [--out DIR]" >&2
       exit 2 ;;
    esac
done
source scripts/deps.sh
fsdp2_install_deps
fsdp2_install_deps openmpi-bin libopenmpi-dev
fsdp2_build build
mkdir -p "$out"
mpicc -O2 -o build/bench/mpi_collectives bench/mpi_collectives.c
mpicc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Iinclude -Ibuild/include -o build/bench/interleaved \
    bench/interleaved.c -Lbuild/lib -lfsdp2 -Wl,-rpath,"$PWD/build/lib"

# shellcheck source=mpi_flags.sh
source bench/mpi_flags.sh
mpi_flags=("${mpi_base[@]}" "${mpi_pml_ucx[@]}")
for rep in $(seq 1 "$repeat"); do
    for np in $np_list; do
        echo "== $np ranks, run $rep of $repeat: libfsdp2"
        build/tools/fsdp2run --nproc-per-node "$np" build/bench/bench_collectives --max "$max" \
            --json "$out/ours_np${np}_$rep.json"
        echo "== $np ranks, run $rep of $repeat: Open MPI (${mpi_flags[*]})"
        mpirun "${mpi_flags[@]}" -np "$np" build/bench/mpi_collectives --max "$max" \
            --json "$out/mpi_np${np}_$rep.json"
    done
done

# CPUs this process may use, as fsdp2run --bind auto counts them (nproc would follow
# OMP_NUM_THREADS)
cpus=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
for np in $np_list; do
    wrap=()
    [ "$np" -gt "$cpus" ] && wrap=(build/tools/fsdp2run --bind core)
    for stream in side current; do
        port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        echo "== $np ranks, interleaved, our stream: $stream"
        mpirun "${mpi_flags[@]}" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" -np "$np" \
            "${wrap[@]}" build/bench/interleaved --max "$max" --pairs "$pairs" --stream "$stream" \
            --json "$out/interleaved_np${np}_$stream.json"
    done
done

python3 - "$out" "$repeat" $np_list <<'PY'
import json, statistics, sys
out, repeat, nps = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
summary = []
for np in nps:
    runs = {}
    limits = []
    reads = []
    for impl in ("ours", "mpi"):
        for rep in range(1, repeat + 1):
            data = json.load(open(f"{out}/{impl}_np{np}_{rep}.json"))
            if impl == "ours":
                limits.append(data.get("memcpy_gbps", 0))
                reads.append(data.get("read_all_gbps", 0))
            for r in data["results"]:
                runs.setdefault((impl, r["op"], r["bytes"]), []).append(r["busbw"])
    limit = statistics.median(limits)
    # A reduce-scatter reads n * S bytes: busbw at most (n - 1) / n^2 of what all ranks
    # read at once (bench/collectives.c).
    n = int(np)
    read_all = statistics.median(reads)
    rs_bound = (n - 1) / (n * n) * read_all
    print(f"\n{np} ranks (memcpy limit {limit:.2f} GB/s; all ranks read {read_all:.2f} GB/s "
          f"at once, so a reduce-scatter's busbw is at most {rs_bound:.2f}): busbw GB/s, "
          f"median of {repeat} run(s) [range]")
    print(f"{'op':<23} {'bytes':>11} {'libfsdp2':>21} {'Open MPI':>21} {'ratio':>6} "
          f"{'of memcpy':>9} {'of bound':>8}")
    for (impl, op, size), ours in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        mpi = runs.get(("mpi", op, size))
        if impl != "ours" or not mpi:
            continue
        a, b = statistics.median(ours), statistics.median(mpi)
        ratio = a / b if b > 0 else float("inf")
        of_limit = a / limit if limit > 0 else 0.0
        bounded = op.startswith("reduce_scatter") and rs_bound > 0 and size >= 64 << 20
        of_bound = f"{a / rs_bound:>8.0%}" if bounded else ""
        print(f"{op:<23} {size:>11} {a:>8.3f} [{min(ours):.2f}-{max(ours):.2f}] "
              f"{b:>8.3f} [{min(mpi):.2f}-{max(mpi):.2f}] {ratio:>6.2f} {of_limit:>9.0%} "
              f"{of_bound}")
        summary.append({"ranks": int(np), "op": op, "bytes": size, "runs": repeat,
                        "libfsdp2_busbw": a, "openmpi_busbw": b, "libfsdp2_runs": ours,
                        "openmpi_runs": mpi, "ratio": ratio, "memcpy_gbps": limit,
                        "read_all_gbps": read_all,
                        "read_bound_gbps": rs_bound if bounded else None})
interleaved = []
for np in nps:
    for stream in ("side", "current"):
        data = json.load(open(f"{out}/interleaved_np{np}_{stream}.json"))
        for r in data["results"]:
            interleaved.append(dict(r, ranks=int(np), stream=stream, pairs=data["pairs"]))
print("\nInterleaved (same processes, alternating blocks): ratio ours/MPI, median over pairs")
print(f"{'op':<23} {'bytes':>11} " + " ".join(f"{f'{np} side':>8} {f'{np} inline':>9}" for np in nps))
cells = {(r["op"], r["bytes"], r["ranks"], r["stream"]): r["ratio"] for r in interleaved}
for op, size in sorted({(r["op"], r["bytes"]) for r in interleaved}):
    row = []
    for np in nps:
        for stream, width in (("side", 8), ("current", 9)):
            v = cells.get((op, size, int(np), stream))
            row.append(f"{v:>{width}.2f}" if v is not None else " " * width)
    print(f"{op:<23} {size:>11} " + " ".join(row))
# The issue's target: ratio >= 1.0 at every size from 64 KiB up.
for name, rows in (("separate runs", summary), ("interleaved", interleaved)):
    cells = [r for r in rows if r["bytes"] >= 65536]
    below = sorted((r["ranks"], r["op"], r["bytes"], r.get("stream", ""), r["ratio"])
                   for r in cells if r["ratio"] < 1.0)
    print(f"\n{name}: {len(cells) - len(below)} of {len(cells)} cells from 64 KiB at or "
          f"above Open MPI" + ("" if not below else "; below: " + ", ".join(
              f"{n}r {op} {b >> 10} KiB{' ' + st if st else ''} {x:.2f}"
              for n, op, b, st, x in below)))
json.dump({"results": summary, "interleaved": interleaved},
          open(f"{out}/collectives.json", "w"), indent=1)
print(f"\nwrote {out}/collectives.json")
PY
