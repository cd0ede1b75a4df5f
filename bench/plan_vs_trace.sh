#!/usr/bin/env bash
# fsdp2-plan's communication estimate of a Fashion-MNIST MLP step against what a trace of
# that step measures, on this machine, at N ranks (default 4):
#
#     bench/plan_vs_trace.sh [BUILD_DIR] [N] [overlap|blocking]
#
# blocking traces the step with FSDP2_CPU_STREAM_BLOCKING=on: each collective runs before
# the next piece of work of its rank is issued, so none shares its rank's CPU with that
# rank's compute (peers still compute while a rank waits for them).
#
# 1. This machine's collectives at N ranks (bench_collectives, all-gather and
#    reduce-scatter from 64 KiB to 4 MiB): a line time = a + b x sent bytes fitted by
#    least squares gives the ring model's latency per step (a / (N - 1)) and bandwidth
#    (1 / b).
# 2. fsdp2-plan on the example's MLP (784-512-256-10, every layer a unit, Adadelta) with
#    that latency and bandwidth: the step's all-gather and reduce-scatter seconds.
# 3. The example traced at N ranks (steps 10 to 29 of one epoch on 3200 images): per
#    step, the sum of the all-gather and reduce-scatter times of the layers, averaged
#    over the steps and ranks (fsdp2-trace summary --json).
# 4. Per collective of the step (matched across ranks by step, kind, layer and order in
#    the step), the median traced duration; the median time from the last rank's start
#    to this rank's end, which leaves out the wait for peers (the merged trace holds
#    every rank on one monotonic clock); bench_collectives' time at that size
#    (interpolated between the measured sizes); and the plan's ring time.
# Prints the three, the ratio plan / trace and the table, and writes
# BUILD_DIR/plan_vs_trace.json.
set -euo pipefail
build=${1:-build}
n=${2:-4}
mode=${3:-overlap}
case "$mode" in
overlap) blocking=off ;;
blocking) blocking=on ;;
*) echo "mode $mode: want overlap or blocking" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run="$build/tools/fsdp2run"

"$run" --nproc-per-node "$n" "$build/bench/bench_collectives" --min 65536 --max 4194304 \
    --ops all_gather,reduce_scatter --json "$tmp/coll.json" >"$tmp/coll.txt"
cat "$tmp/coll.txt"
read -r lat_us bw_gbs < <(python3 - "$tmp/coll.json" "$n" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); n = int(sys.argv[2])
pts = [((n - 1) / n * r["bytes"], r["time_us"]) for r in d["results"]]
mx = sum(x for x, _ in pts) / len(pts); my = sum(y for _, y in pts) / len(pts)
b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
a = my - b * mx
print("%.3f %.4f" % (max(a / (n - 1), 0.001), 1e-3 / b))
PY
)
echo "fitted: latency ${lat_us} us per ring step, bandwidth ${bw_gbs} GB/s per rank"

cat >"$tmp/mlp.json" <<'JSON'
{"params": [{"name": "fc1.weight", "shape": [512, 784]}, {"name": "fc1.bias", "shape": [512]},
            {"name": "fc2.weight", "shape": [256, 512]}, {"name": "fc2.bias", "shape": [256]},
            {"name": "fc3.weight", "shape": [10, 256]}, {"name": "fc3.bias", "shape": [10]}]}
JSON
"$build/tools/fsdp2-plan" --json "$tmp/mlp.json" --ranks "$n" --ranks-per-host "$n" \
    --units every --optimizer adadelta --bw "intra=${bw_gbs}GB/s,inter=${bw_gbs}GB/s" \
    --lat "intra=${lat_us}us,inter=${lat_us}us" --json-out >"$tmp/plan.json"

FSDP2_CPU_STREAM_BLOCKING=$blocking \
    "$run" --nproc-per-node "$n" "$build/examples/fashion_mnist" --model mlp --epochs 1 \
    --limit 3200 --trace "$tmp/trace.json" --trace-steps 10:29 >"$tmp/run.txt" 2>&1 ||
    { cat "$tmp/run.txt"; exit 1; }
"$build/tools/fsdp2-trace" summary "$tmp/trace.json" --json >"$tmp/summary.json"

python3 - "$tmp/plan.json" "$tmp/summary.json" "$build/plan_vs_trace.json" "$n" \
    "$lat_us" "$bw_gbs" "$tmp/trace.json" "$tmp/coll.json" "$mode" <<'PY'
import collections, json, statistics, sys
plan = json.load(open(sys.argv[1])); summ = json.load(open(sys.argv[2]))
n, lat, bw = int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
trace = json.load(open(sys.argv[7]))["traceEvents"]; coll = json.load(open(sys.argv[8]))

# 4. per collective: args.bytes is the shard, so the collective's payload is n x it
calls = collections.defaultdict(list)
seen = collections.Counter()
for e in sorted((e for e in trace if e.get("ph") == "X" and
                 e.get("cat") in ("all_gather", "reduce_scatter")),
                key=lambda e: (e["pid"], e["ts"])):
    a = e["args"]
    k = (e["pid"], a["step"], e["cat"], a["module"])
    calls[(a["step"], e["cat"], a["module"], seen[k])].append(e)
    seen[k] += 1
rows = collections.defaultdict(lambda: ([], []))
for (step, cat, module, k), es in calls.items():
    last = max(e["ts"] for e in es)
    for e in es:
        rows[(cat, module, k, e["args"]["bytes"] * n)][0].append(e["dur"])
        rows[(cat, module, k, e["args"]["bytes"] * n)][1].append(max(0.0, e["ts"] + e["dur"] - last))

def bench_us(op, size):
    pts = sorted((r["bytes"], r["time_us"]) for r in coll["results"] if r["op"] == op)
    if size <= pts[0][0]:
        return pts[0][1] * size / pts[0][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if size <= x1:
            return y0 + (y1 - y0) * (size - x0) / (x1 - x0)
    return pts[-1][1] * size / pts[-1][0]

table = []
print("%-15s %-4s %2s %10s %10s %12s %10s %10s" % ("collective", "unit", "#", "bytes",
      "traced us", "after last", "bench us", "plan us"))
for (cat, module, k, size), (durs, after) in sorted(rows.items()):
    r = {"op": cat, "module": module, "call": k, "bytes": size,
         "traced_us": statistics.median(durs), "after_last_start_us": statistics.median(after),
         "bench_us": bench_us(cat, size),
         "plan_us": (n - 1) * lat + (n - 1) / n * size / (bw * 1e3)}
    table.append(r)
    print("%-15s %-4s %2d %10d %10.0f %12.0f %10.0f %10.0f" % (cat, module, k, size,
          r["traced_us"], r["after_last_start_us"], r["bench_us"], r["plan_us"]))
st = plan["step"]
planned_ms = 1e3 * (st["all_gather"]["seconds"] + st["reduce_scatter"]["seconds"])
per_step = [sum(m["all_gather_ms"] + m["reduce_scatter_ms"] for m in s["modules"])
            for s in summ["steps"]]
traced_ms = sum(per_step) / len(per_step)
print("%-34s %10s" % ("", "ms / step"))
print("%-34s %10.3f" % ("fsdp2-plan (ring model, fitted)", planned_ms))
print("%-34s %10.3f  (%d rank-steps, %.3f to %.3f)" % ("traced collectives", traced_ms,
      len(per_step), min(per_step), max(per_step)))
after_ms = sum(r["after_last_start_us"] for r in table) / 1e3
bench_ms = sum(r["bench_us"] for r in table) / 1e3
print("%-34s %10.3f" % ("traced, from the last rank's start", after_ms))
print("%-34s %10.3f" % ("bench_collectives at those sizes", bench_ms))
print("%-34s %10.3f" % ("plan / trace", planned_ms / traced_ms))
print("%-34s %10.3f" % ("plan / trace from last start", planned_ms / after_ms))
json.dump({"ranks": n, "mode": sys.argv[9], "latency_us": lat, "bandwidth_gbs": bw,
           "planned_ms": planned_ms, "traced_ms": traced_ms, "traced_min_ms": min(per_step),
           "traced_max_ms": max(per_step), "after_last_start_ms": after_ms,
           "bench_ms": bench_ms, "ratio": planned_ms / traced_ms,
           "ratio_after_last_start": planned_ms / after_ms,
           "planned": st, "collectives": table}, open(sys.argv[3], "w"), indent=1)
print("wrote", sys.argv[3])
PY
