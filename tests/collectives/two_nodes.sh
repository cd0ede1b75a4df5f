#!/usr/bin/env bash
# Two "nodes" on this machine: two fsdp2run instances with --nnodes 2 on loopback, 2
# ranks each, with UCX_TLS=tcp so that the path between them is really TCP, running
# coll_check (world collectives and an HSDP [2,2] mesh). Then again with UCX's own
# peer-failure handling forced on (FSDP2_UCX_ERROR_MODE=peer), the cross-host mode. Both
# "nodes" share this host, so FSDP2_SHM=off keeps the shared-memory transport out of
# those two runs; a third run leaves it on (world and mesh groups then use it).
set -euo pipefail
fsdp2run=$1
check=$2
for run in auto,off peer,off auto,on; do
    mode=${run%,*} shm=${run#*,}
    # a fresh free port per run (port + 1 of an earlier pick was sometimes taken)
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    out=$(mktemp -d)
    export UCX_TLS=tcp FSDP2_UCX_ERROR_MODE=$mode FSDP2_SHM=$shm FSDP2_TIMEOUT=60
    for node in 0 1; do
        "$fsdp2run" --nnodes 2 --node-rank "$node" --nproc-per-node 2 --master-addr 127.0.0.1 \
            --master-port "$port" "$check" >"$out/node$node.log" 2>&1 &
    done
    status=0
    wait %1 || status=$?
    wait %2 || status=$?
    cat "$out"/node*.log
    ok=$(grep -c "collectives and mesh OK" "$out"/node*.log | awk -F: '{s += $2} END {print s}')
    rm -rf "$out"
    if [ "$status" -ne 0 ] || [ "$ok" -ne 4 ]; then
        echo "two nodes (error mode $mode, shm $shm): exit $status, $ok of 4 ranks OK"
        exit 1
    fi
    echo "two nodes (error mode $mode, shm $shm): 4 of 4 ranks OK"
done
