#!/usr/bin/env bash
# The collectives across two hosts made of namespaces (tests/hosts/hosts.sh), 2 ranks on
# each, with the link between them at each RATE: libfsdp2 (bench_collectives under one
# fsdp2run per host: shared memory within a host, UCX over TCP across) against Open MPI
# (mpi_collectives under one mpirun on host 0, which starts host 1's ranks through
# tests/hosts/mpi_agent.sh as it would through ssh), twice: with its UCX pml as in
# bench/collectives.sh, and with its ob1 pml over its own TCP and shared-memory btls;
# each cell compares with the faster of the two.
#
#     bench/hosts_collectives.sh [BUILD_DIR] [RATES] [MAX_BYTES]
#         (root; RATES default "10gbit unlimited", MAX_BYTES default 16 MiB)
#
# Installs Open MPI if missing (the peer only). Prints busbw side by side with the ratio
# ours / Open MPI per op and size from 64 KiB, and writes BUILD_DIR/hosts_collectives.json.
set -euo pipefail
build=${1:-build}
rates=${2:-"10gbit unlimited"}
max=${3:-$((16 << 20))}
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../tests/hosts/hosts.sh
source "$here/tests/hosts/hosts.sh"
hosts_can || exit 1
# shellcheck source=../scripts/deps.sh
source "$here/scripts/deps.sh"
# shellcheck source=mpi_flags.sh
source "$here/bench/mpi_flags.sh"
fsdp2_install_deps openmpi-bin libopenmpi-dev
out=$(mktemp -d)
chmod 755 "$out"
trap 'hosts_down; rm -rf "$out"' EXIT
mpicc -O2 -o "$out/mpi_collectives" "$here/bench/mpi_collectives.c"
ops=all_gather,reduce_scatter,all_reduce
export HOSTS_PREFIX

for rate in $rates; do
    hosts_up 2 "$rate"
    master=$(hosts_addr 0)
    echo "== link $rate: libfsdp2"
    port=$((29500 + RANDOM % 1000))
    pids=()
    for k in 0 1; do
        hosts_run "$k" "$build/tools/fsdp2run" --nnodes 2 --node-rank "$k" --nproc-per-node 2 \
            --master-addr "$master" --master-port "$port" "$build/bench/bench_collectives" \
            --min 65536 --max "$max" --ops "$ops" --json "$out/ours.$rate.json" \
            >"$out/ours.$rate.$k.log" 2>&1 &
        pids+=($!)
    done
    for k in 0 1; do
        wait "${pids[$k]}" || { tail -n 20 "$out/ours.$rate.$k.log"
                                echo "bench/hosts_collectives.sh: host $k failed" >&2; exit 1; }
    done
    cat "$out/ours.$rate.0.log"
    for pml in ucx ob1; do
        echo "== link $rate: Open MPI, pml $pml"
        if [ "$pml" = ucx ]; then
            transport=("${mpi_pml_ucx[@]}")
        else
            transport=(--mca pml ob1 --mca btl tcp,vader,self)
        fi
        hosts_run 0 mpirun "${mpi_base[@]}" \
            --mca plm_rsh_agent "$here/tests/hosts/mpi_agent.sh" \
            --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 "${transport[@]}" \
            --host "$(hosts_addr 0):2,$(hosts_addr 1):2" -np 4 \
            "$out/mpi_collectives" --min 65536 --max "$max" --ops "$ops" \
            --json "$out/mpi_$pml.$rate.json"
    done
    hosts_down
done

python3 - "$out" "$build/hosts_collectives.json" $rates <<'PY'
import json, sys
out, dest, rates = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = []
print("%-10s %-15s %10s %14s %14s %4s %7s" % ("link", "op", "bytes", "libfsdp2 busbw",
                                              "Open MPI busbw", "pml", "ratio"))
for rate in rates:
    ours = {(r["op"], r["bytes"]): r for r in json.load(open(f"{out}/ours.{rate}.json"))["results"]}
    mpi = {}
    for pml in ("ucx", "ob1"):
        for r in json.load(open(f"{out}/mpi_{pml}.{rate}.json"))["results"]:
            key = (r["op"], r["bytes"])
            if key not in mpi or r["busbw"] > mpi[key][0]:
                mpi[key] = (r["busbw"], pml)
    for key in sorted(ours):
        if key not in mpi:
            continue
        a, (b, pml) = ours[key]["busbw"], mpi[key]
        rows.append({"rate": rate, "op": key[0], "bytes": key[1], "ours_busbw": a,
                     "mpi_busbw": b, "mpi_pml": pml, "ratio": a / b if b else None})
        print("%-10s %-15s %10d %14.3f %14.3f %4s %7s" % (rate, key[0], key[1], a, b, pml,
              "-" if b == 0 else "%.2f" % (a / b)))
json.dump({"ranks": "2 hosts x 2", "rows": rows}, open(dest, "w"), indent=1)
print("wrote", dest)
PY
