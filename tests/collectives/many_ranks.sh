#!/usr/bin/env bash
# 72 ranks on one host, more than one 64-bit word of the transport's rank bitmaps:
# coll_check --quick (every collective and dtype, multi-step sizes) must pass on every
# rank, and the world group must run over shared memory, not fall back to UCX messages.
#   many_ranks.sh FSDP2RUN COLL_CHECK
set -euo pipefail
run=$1 check=$2
n=72
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
FSDP2_LOG_LEVEL=info "$run" --nproc-per-node "$n" "$check" --quick >"$log" 2>&1 || status=$?
ok=$(grep -c "collectives and mesh OK" "$log" || true)
shm=$(grep -c "group 'world': shared memory" "$log" || true)
if [ "$status" != 0 ] || [ "$ok" != "$n" ] || [ "$shm" != "$n" ]; then
    grep -v " INFO " "$log" | tail -n 40
    echo "FAIL: exit $status, $ok of $n ranks OK, $shm of $n on shared memory"
    exit 1
fi
echo "$n ranks: every collective OK over shared memory"
