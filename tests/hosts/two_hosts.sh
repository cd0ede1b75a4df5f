#!/usr/bin/env bash
# Two hosts made of namespaces (hosts.sh: their own network, hostname, IPC, /dev/shm and
# pids), 2 ranks each, one fsdp2run per host, the store on host 0's address:
#   1. coll_check (every collective, dtype and count, and an HSDP mesh), then again with
#      both hosts named alike and sharing this machine's pids, as containers can: shared
#      memory must still stay within each host, without a try across (no "no shared
#      memory" fallback);
#   2. Fashion-MNIST with FSDP over the 4 ranks and with HSDP [2 hosts, 2 ranks] reaches
#      the losses of the same run on one host;
#   3. a checkpoint saved by the two hosts (each its own ranks' files, into a directory
#      both see) resumes on one host at 3 ranks with the losses of the uninterrupted run;
#   4. every process of host 1 killed mid-run: host 0's ranks fail within FSDP2_TIMEOUT
#      naming a lost rank, and host 0's /dev/shm keeps nothing of ours (host 1's private
#      /dev/shm goes with its namespaces).
#   two_hosts.sh FSDP2RUN COLL_CHECK FASHION_MNIST
set -euo pipefail
run=$1 check=$2 prog=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hosts.sh
source "$here/hosts.sh"
hosts_can || { echo "SKIP: namespaces for two hosts cannot be made here"; exit 77; }
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "SKIP: $data is missing (dataset-fashion-mnist)"; exit 77; }
out=$(mktemp -d)
chmod 755 "$out"
hosts_up 2 10gbit
trap 'hosts_down; rm -rf "$out"' EXIT
master=$(hosts_addr 0)
export FSDP2_TIMEOUT=30
fail() { echo "FAIL: $*"; exit 1; }

# both hosts at once: both_hosts NAME ARGS... (host K's output in $out/NAME.K.log)
both_hosts() {
    local name=$1
    shift
    local port=$((29500 + RANDOM % 1000)) pids=() k status=0
    for k in 0 1; do
        hosts_run "$k" "$run" --nnodes 2 --node-rank "$k" --nproc-per-node 2 \
            --master-addr "$master" --master-port "$port" "$@" >"$out/$name.$k.log" 2>&1 &
        pids+=($!)
    done
    for k in 0 1; do wait "${pids[$k]}" || status=$?; done
    return $status
}

# 1. collectives
both_hosts coll "$check" || { cat "$out"/coll.*.log; fail "coll_check across two hosts"; }
n=$(cat "$out"/coll.*.log | grep -c "collectives and mesh OK" || true)
[ "$n" = 4 ] || { cat "$out"/coll.*.log; fail "$n of 4 ranks OK"; }
HOSTS_HOSTNAME=alike HOSTS_SHARE_PID=1 both_hosts alike "$check" ||
    { cat "$out"/alike.*.log; fail "coll_check across two hosts named alike"; }
if grep -h "no shared memory" "$out"/alike.*.log; then
    fail "a group tried shared memory across hosts named alike"
fi
echo "1. collectives across two hosts: 4 of 4 ranks OK, twice"

# 2. training: the losses of one host
common=(--model mlp --epochs 2 --limit 1280 --seed 3)
"$run" --nproc-per-node 4 "$prog" "${common[@]}" --json "$out/one.json" >/dev/null
both_hosts fsdp "$prog" "${common[@]}" --json "$out/fsdp.json" ||
    { cat "$out"/fsdp.*.log; fail "FSDP across two hosts"; }
both_hosts hsdp "$prog" "${common[@]}" --hsdp --json "$out/hsdp.json" ||
    { cat "$out"/hsdp.*.log; fail "HSDP across two hosts"; }
grep -h "HSDP \[2 replicas, 2 shards\]" "$out/hsdp.0.log" >/dev/null ||
    fail "the HSDP run was not [2 replicas, 2 shards]"

# 3. a checkpoint of both hosts, resumed on one host at 3 ranks
both_hosts save "$prog" "${common[@]}" --epochs 1 --save "$out/ckpt" ||
    { cat "$out"/save.*.log; fail "saving across two hosts"; }
"$run" --nproc-per-node 3 "$prog" "${common[@]}" --batch 63 --resume "$out/ckpt" \
    --json "$out/resumed.json" >"$out/resume.log" 2>&1 ||
    { cat "$out/resume.log"; fail "resuming at 3 ranks"; }
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
one = {e["epoch"]: e for e in json.load(open(f"{out}/one.json"))["epochs"]}
bad = 0
for name in ("fsdp", "hsdp"):
    for e in json.load(open(f"{out}/{name}.json"))["epochs"]:
        for key in ("train_loss", "test_loss"):
            x, y = one[e["epoch"]][key], e[key]
            ok = abs(x - y) <= 1e-4 * max(1.0, abs(x))
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name} epoch {e['epoch']} {key}: one host {x}, two hosts {y}")
resumed = json.load(open(f"{out}/resumed.json"))["epochs"]
ok = len(resumed) == 1 and resumed[0]["epoch"] == 2
print(f"{'ok  ' if ok else 'FAIL'} resumed at 3 ranks: epochs {[e['epoch'] for e in resumed]}")
bad += not ok
sys.exit(1 if bad else 0)
PY
echo "2, 3. training across two hosts: the losses of one host; the checkpoint resumed at 3 ranks"

# 4. host 1 lost: everything in its pid namespace killed
export FSDP2_TIMEOUT=10
port=$((29500 + RANDOM % 1000))
hosts_run 0 bash -c '"$@"; status=$?; echo "exit $status"; echo "shm: $(ls /dev/shm | grep -c fsdp2 || true)"' \
    keep "$run" --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr "$master" \
    --master-port "$port" "$prog" --model mlp --epochs 50 --limit 3200 >"$out/lost.0.log" 2>&1 &
h0=$!
hosts_run 1 bash -c '"$@" & sleep 6; kill -9 -1; echo "killed"' \
    keep "$run" --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr "$master" \
    --master-port "$port" "$prog" --model mlp --epochs 50 --limit 3200 >"$out/lost.1.log" 2>&1 || true
start=$(date +%s)
wait "$h0" || true
took=$(($(date +%s) - start))
cat "$out/lost.0.log" | tail -n 12
grep -q "^exit 0" "$out/lost.0.log" && fail "host 0 finished as if nothing happened"
grep -Eq "(rank|peer) [23] failed" "$out/lost.0.log" || fail "host 0's error names no rank of host 1"
[ "$took" -le 25 ] || fail "host 0 took $took s to fail after host 1 was lost (FSDP2_TIMEOUT 10 s)"
grep -q "^shm: 0$" "$out/lost.0.log" || fail "host 0's /dev/shm keeps segments"
echo "4. host 1 lost: host 0 failed $took s after, naming it; its /dev/shm clean"
