#!/usr/bin/env bash
# FSDP over 4 ranks against HSDP [2 hosts, 2 ranks] across two hosts made of namespaces
# (tests/hosts/hosts.sh), with the link between them at each RATE: the step time, and
# the bytes each rank sends across hosts per step (the hosts' eth0 transmit counters)
# against what the collectives' formulas predict (fsdp2-plan's payloads: docs/planning.md).
#
#     bench/hosts.sh [BUILD_DIR] [RATES] [MODELS]
#         (root; RATES default "1gbit 10gbit unlimited", MODELS default "mlp gpt2")
#
# The models:
# - mlp: examples/fashion_mnist --model mlp (784-512-256-10, every layer a unit), one
#   epoch of 3072 images at a global batch of 64 (48 steps), then its test pass over 3072
#   images (8 forwards of up to 100 images per rank, whose all-gathers also cross hosts
#   under FSDP: the formula counts them, spread over the steps);
# - gpt2: examples/lm --preset small (6 blocks of 384, 10.8 M parameters), 6 steps of
#   8 sequences per rank, no validation.
# Across hosts, per rank and step, the direct (pairwise) algorithms send: FSDP over 4
# ranks, 2 of them remote, half of each all-gather's and reduce-scatter's payload; HSDP,
# the all-reduce of its gradient shard (2 (R - 1) / R of it, R = 2). The counters also
# carry TCP/IP headers and the ACKs of what a host receives (a few % above the payload),
# and the steps' small all-reduces (loss, norm).
# Prints a table and writes BUILD_DIR/hosts.json.
set -euo pipefail
build=${1:-build}
rates=${2:-"1gbit 10gbit unlimited"}
models=${3:-"mlp gpt2"}
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../tests/hosts/hosts.sh
source "$here/tests/hosts/hosts.sh"
hosts_can || exit 1
run="$build/tools/fsdp2run"
out=$(mktemp -d)
chmod 755 "$out"
trap 'hosts_down; rm -rf "$out"' EXIT

tx() { # tx K: host K's eth0 transmitted bytes
    ip -n "$HOSTS_PREFIX-h$1" -s -j link show eth0 |
        python3 -c "import json, sys; print(json.load(sys.stdin)[0]['stats64']['tx']['bytes'])"
}

for rate in $rates; do
    hosts_up 2 "$rate"
    master=$(hosts_addr 0)
    for model in $models; do
        case $model in
        mlp) cmd=("$build/examples/fashion_mnist" --model mlp --epochs 1 --limit 3072) ;;
        gpt2) cmd=("$build/examples/lm" --preset small --steps 6 --batch 32 --val-every 0
                   --log-every 1) ;;
        *) echo "bench/hosts.sh: unknown model '$model' (mlp, gpt2)" >&2; exit 2 ;;
        esac
        for mode in fsdp hsdp; do
            extra=()
            [ "$mode" = hsdp ] && extra=(--hsdp)
            a0=$(tx 0) a1=$(tx 1)
            port=$((29500 + RANDOM % 1000))
            name="$model.$mode.$rate"
            pids=()
            for k in 0 1; do
                hosts_run "$k" "$run" --nnodes 2 --node-rank "$k" --nproc-per-node 2 \
                    --master-addr "$master" --master-port "$port" "${cmd[@]}" "${extra[@]}" \
                    --json "$out/$name.$k.json" >"$out/$name.$k.log" 2>&1 &
                pids+=($!)
            done
            for k in 0 1; do
                wait "${pids[$k]}" || { tail -n 20 "$out/$name.$k.log"
                                        echo "bench/hosts.sh: $name failed on host $k" >&2
                                        exit 1; }
            done
            b0=$(tx 0) b1=$(tx 1)
            echo "$model $rate $mode $((b0 - a0)) $((b1 - a1))" >>"$out/bytes.txt"
        done
    done
    hosts_down
done

# the formulas: each model's plan on the same meshes
python3 - "$out" "$build" "$build/hosts.json" <<'PY'
import json, subprocess, sys
out, build, dest = sys.argv[1], sys.argv[2], sys.argv[3]

def gpt2_small():
    # examples/lm --preset small: 6 blocks of 384, 256 positions, 256 byte tokens, the
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
    return ({"params": [{"name": n, "shape": s} for n, s in params],
             "ties": [{"name": "lm_head.weight", "target": "wte.weight"}]}, ["--keep-last"])

def mlp():
    params = [("fc1.weight", [512, 784]), ("fc1.bias", [512]), ("fc2.weight", [256, 512]),
              ("fc2.bias", [256]), ("fc3.weight", [10, 256]), ("fc3.bias", [10])]
    return ({"params": [{"name": n, "shape": s} for n, s in params]}, ["--units", "every"])

def plan(model, mesh):
    spec, flags = {"mlp": mlp, "gpt2": gpt2_small}[model]()
    path = f"{out}/{model}.json"
    json.dump(spec, open(path, "w"))
    return json.loads(subprocess.check_output(
        [f"{build}/tools/fsdp2-plan", "--json", path, *mesh, *flags, "--json-out"]))["step"]

# per model: train steps, and the test pass's forwards (their all-gathers cross hosts
# under FSDP; under HSDP they stay within a host)
runs = {"mlp": (48, 8), "gpt2": (6, 0)}

def predict(model, mode):
    steps, evals = runs[model]
    if mode == "hsdp":
        return plan(model, ["--mesh", "2,2"])["all_reduce"]["sent"]
    st = plan(model, ["--ranks", "4"])
    ag, rs = st["all_gather"], st["reduce_scatter"]
    # FSDP's 2 remote peers of 3 get half of each payload (a quarter each); a test forward
    # gathers what a training step's forward does, half the step's all-gather calls here
    # (every unit gathers again in backward)
    forward_ag = ag["bytes"] / 2
    return (ag["bytes"] + rs["bytes"]) / 2 + evals * forward_ag / 2 / steps

rows = []
for line in open(f"{out}/bytes.txt"):
    model, rate, mode, t0, t1 = line.split()
    steps = runs[model][0]
    ms = []
    for k in (0, 1):
        try:
            d = json.load(open(f"{out}/{model}.{mode}.{rate}.{k}.json"))
        except (OSError, ValueError):
            continue
        if model == "gpt2":
            ms += [r["ms"] for r in d["records"] if r["step"] > 1]
        else:
            ms += [1e3 * e["seconds"] / steps for e in d["epochs"]]
    if not ms:
        sys.exit(f"bench/hosts.sh: no step times from {model} {mode} at {rate}")
    step_ms = sum(ms) / len(ms)
    per_rank = (int(t0) + int(t1)) / 4 / steps
    p = predict(model, mode)
    rows.append({"model": model, "rate": rate, "mode": mode, "step_ms": step_ms,
                 "sent_per_rank_step": per_rank, "predicted": p, "ratio": per_rank / p})
print("%-5s %-10s %-5s %12s %18s %18s %8s" % ("model", "link", "mode", "step ms",
                                              "sent/rank/step B", "formula B", "ratio"))
for r in rows:
    print("%-5s %-10s %-5s %12.1f %18.0f %18.0f %8.3f" % (r["model"], r["rate"], r["mode"],
          r["step_ms"], r["sent_per_rank_step"], r["predicted"], r["ratio"]))
json.dump({"models": {"mlp": "examples/fashion_mnist --model mlp, 48 steps and a test pass",
                      "gpt2": "examples/lm --preset small, 6 steps"}, "rows": rows},
          open(dest, "w"), indent=1)
print("wrote", dest)
PY
