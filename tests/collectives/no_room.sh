#!/usr/bin/env bash
# A /dev/shm with no room for every rank's ring (a private 3 MiB tmpfs; 4 ranks need
# 4 MiB of rings): the ranks that cannot reserve theirs say so, every member of the group
# goes over UCX messages instead, every collective still checks out, and nothing of ours
# is left in /dev/shm. UCX is kept off /dev/shm too (UCX_TLS=^posix,sysv), which it would
# otherwise need for itself.
#   no_room.sh FSDP2RUN COLL_CHECK
set -euo pipefail
run=$1 check=$2
if [ "$(id -u)" != 0 ] || ! unshare --mount true 2>/dev/null; then
    echo "SKIP: a private /dev/shm needs root (unshare --mount)"
    exit 77
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
unshare --mount bash -c '
    mount -t tmpfs -o size=3m tmpfs /dev/shm || exit 97
    UCX_TLS=^posix,sysv FSDP2_LOG_LEVEL=warn "$1" --nproc-per-node 4 "$2" --quick
    s=$?
    echo "left in /dev/shm: $(ls /dev/shm | grep -c fsdp2 || true)"
    exit $s' no_room "$run" "$check" >"$log" 2>&1 || status=$?
grep -v "Endpoint timeout" "$log" | tail -n 20 || true
ok=$(grep -c "collectives and mesh OK" "$log" || true)
[ "$status" = 0 ] && [ "$ok" = 4 ] || { echo "FAIL: exit $status, $ok of 4 ranks OK"; exit 1; }
grep -q "no shared memory (posix_fallocate (this rank's ring)" "$log" ||
    { echo "FAIL: no rank said it could not reserve its ring"; exit 1; }
grep -q "^left in /dev/shm: 0$" "$log" || { echo "FAIL: segments left in /dev/shm"; exit 1; }
echo "no room for the rings: every group went over UCX, all collectives OK, /dev/shm clean"
