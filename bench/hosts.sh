#!/usr/bin/env bash
# FSDP over 4 ranks against HSDP [2 hosts, 2 ranks] across two hosts made of namespaces
# (tests/hosts/hosts.sh), with the link between them at each RATE: the step time, and
# the bytes each rank sends across hosts per step (the hosts' eth0 transmit counters)
# against what the collectives' formulas predict (fsdp2-plan's payloads: docs/planning.md).
#
#     bench/hosts.sh [BUILD_DIR] [RATES]      (root; RATES default "1gbit 10gbit unlimited")
#
# The model is examples/gpt2 --preset small (6 blocks of 384, 10.8 M parameters), 6 steps
# of 8 sequences per rank, no validation. Across hosts, per rank and step, the direct
# (pairwise) algorithms send: FSDP over 4 ranks, 2 of them remote, half of each all-gather's
# and reduce-scatter's payload; HSDP, the all-reduce of its gradient shard (2 (R - 1) / R
# of it, R = 2). The counters also carry TCP/IP headers and the ACKs of what a host
# receives (a few % above the payload), and the steps' small all-reduces (loss, norm).
# Prints a table and writes BUILD_DIR/hosts.json.
set -euo pipefail
build=${1:-build}
rates=${2:-"1gbit 10gbit unlimited"}
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../tests/hosts/hosts.sh
source "$here/tests/hosts/hosts.sh"
hosts_can || exit 1
run="$build/tools/fsdp2run"
gpt2="$build/examples/gpt2"
steps=6
out=$(mktemp -d)
chmod 755 "$out"
trap 'hosts_down; rm -rf "$out"' EXIT
common=(--preset small --steps "$steps" --batch 32 --val-every 0 --log-every 1)

tx() { # tx K: host K's eth0 transmitted bytes
    ip -n "$HOSTS_PREFIX-h$1" -s -j link show eth0 |
        python3 -c "import json, sys; print(json.load(sys.stdin)[0]['stats64']['tx']['bytes'])"
}

for rate in $rates; do
    hosts_up 2 "$rate"
    master=$(hosts_addr 0)
    for mode in fsdp hsdp; do
        extra=()
        [ "$mode" = hsdp ] && extra=(--hsdp)
        a0=$(tx 0) a1=$(tx 1)
        port=$((29500 + RANDOM % 1000))
        for k in 0 1; do
            hosts_run "$k" "$run" --nnodes 2 --node-rank "$k" --nproc-per-node 2 \
                --master-addr "$master" --master-port "$port" "$gpt2" "${common[@]}" \
                "${extra[@]}" --json "$out/$mode.$rate.$k.json" >"$out/$mode.$rate.$k.log" 2>&1 &
        done
        wait
        b0=$(tx 0) b1=$(tx 1)
        echo "$rate $mode $((b0 - a0)) $((b1 - a1))" >>"$out/bytes.txt"
    done
    hosts_down
done

# the formulas: this model's plan on the same meshes
python3 - "$out" "$build" "$steps" "$build/hosts.json" <<'PY'
import json, subprocess, sys
out, build, steps, dest = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

def plan(mesh):
    # examples/gpt2 --preset small: 6 blocks of 384, 256 positions, 256 byte tokens, the
    # last block kept whole; f32, AdamW
    params = [("wte.weight", [256, 384]), ("wpe.weight", [256, 384])]
    for l in range(6):
        p = f"h.{l}."
        params += [(p + "ln_1.weight", [384]), (p + "ln_1.bias", [384]),
                   (p + "attn.c_attn.weight", [1152, 384]), (p + "attn.c_attn.bias", [1152]),
                   (p + "attn.c_proj.weight", [384, 384]), (p + "attn.c_proj.bias", [384]),
                   (p + "ln_2.weight", [384]), (p + "ln_2.bias", [384]),
                   (p + "mlp.c_fc.weight", [1536, 384]), (p + "mlp.c_fc.bias", [1536]),
                   (p + "mlp.c_proj.weight", [384, 1536]), (p + "mlp.c_proj.bias", [384])]
    params += [("ln_f.weight", [384]), ("ln_f.bias", [384])]
    model = {"params": [{"name": n, "shape": s} for n, s in params],
             "ties": [{"name": "lm_head.weight", "target": "wte.weight"}]}
    path = f"{out}/small.json"
    json.dump(model, open(path, "w"))
    return json.loads(subprocess.check_output(
        [f"{build}/tools/fsdp2-plan", "--json", path, *mesh, "--keep-last", "--json-out"]))

fsdp, hsdp = plan(["--ranks", "4"]), plan(["--mesh", "2,2"])
# across hosts per rank and step: FSDP's 2 remote peers of 3 get half of each payload
# (a quarter each); HSDP's one remote replica gets its all-reduce share
predict = {"fsdp": (fsdp["step"]["all_gather"]["bytes"] + fsdp["step"]["reduce_scatter"]["bytes"]) / 2,
           "hsdp": hsdp["step"]["all_reduce"]["sent"]}
rows = []
for line in open(f"{out}/bytes.txt"):
    rate, mode, t0, t1 = line.split()
    recs = []
    for k in (0, 1):
        try:
            recs += json.load(open(f"{out}/{mode}.{rate}.{k}.json"))["records"]
        except (OSError, ValueError):
            pass
    ms = [r["ms"] for r in recs if r["step"] > 1]
    step_ms = sum(ms) / len(ms) if ms else float("nan")
    per_rank = (int(t0) + int(t1)) / 4 / steps
    rows.append({"rate": rate, "mode": mode, "step_ms": step_ms, "sent_per_rank_step": per_rank,
                 "predicted": predict[mode], "ratio": per_rank / predict[mode]})
print("%-10s %-5s %12s %18s %18s %8s" % ("link", "mode", "step ms", "sent/rank/step B",
                                         "formula B", "ratio"))
for r in rows:
    print("%-10s %-5s %12.1f %18.0f %18.0f %8.3f" % (r["rate"], r["mode"], r["step_ms"],
          r["sent_per_rank_step"], r["predicted"], r["ratio"]))
json.dump({"model": "examples/gpt2 --preset small", "steps": steps, "rows": rows}, open(dest, "w"), indent=1)
print("wrote", dest)
PY
