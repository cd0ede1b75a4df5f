#!/usr/bin/env bash
# Two builds of libfsdp2 against each other, collective by collective: bench_collectives
# of build A and of build B run alternately (A B A B ...) REPEAT times at each rank
# count, so that the host's slow and fast phases fall on both; each cell is the median
# busbw of each side and the ratio B / A. For a change to the collectives: build the old
# tree into A (git worktree add /tmp/old REV; meson setup /tmp/old/build ...), the new
# one into B, and run this.
#
#     bench/collectives_ab.sh A_BUILD B_BUILD [--np "2 4"] [--repeat R] [--min BYTES]
#                             [--max BYTES] [--ops LIST] [--out FILE]
#
# Prints the table and writes FILE (default B_BUILD/collectives_ab.json): per cell both
# sides' busbw of every run and the medians.
set -euo pipefail
usage() {
    echo "usage: $0 A_BUILD B_BUILD [--np \"2 4\"] [--repeat R] [--min BYTES] [--max BYTES]" \
         "[--ops LIST] [--out FILE]" >&2
    exit 2
}
[ $# -ge 2 ] || usage
a=$1 b=$2
shift 2
np_list="2 4" repeat=5 min=65536 max=$((64 << 20)) ops="" out=""
while [ $# -gt 0 ]; do
    case $1 in
    --np) np_list=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --min) min=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) usage ;;
    esac
done
[[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "--repeat $repeat: want a count >= 1" >&2; exit 2; }
out=${out:-$b/collectives_ab.json}
for build in "$a" "$b"; do
    for f in tools/fsdp2run bench/bench_collectives; do
        [ -x "$build/$f" ] || { echo "$build/$f is missing: build it first" >&2; exit 2; }
    done
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
extra=(--min "$min" --max "$max")
[ -n "$ops" ] && extra+=(--ops "$ops")
for np in $np_list; do
    for rep in $(seq 1 "$repeat"); do
        for side in a b; do
            build=$a
            [ "$side" = b ] && build=$b
            echo "== $np ranks, run $rep of $repeat: $side ($build)"
            "$build/tools/fsdp2run" --nproc-per-node "$np" "$build/bench/bench_collectives" \
                "${extra[@]}" --json "$tmp/$side.$np.$rep.json" >/dev/null
        done
    done
done
python3 - "$tmp" "$out" "$repeat" "$a" "$b" $np_list <<'PY'
import json, statistics, sys
tmp, out, repeat, a, b, nps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6:]
cells = {}
for np in nps:
    for rep in range(1, repeat + 1):
        for side in ("a", "b"):
            for r in json.load(open(f"{tmp}/{side}.{np}.{rep}.json"))["results"]:
                cells.setdefault((int(np), r["op"], r["bytes"]), {"a": [], "b": []})[side].append(r["busbw"])
rows = []
print(f"busbw GB/s, medians of {repeat} alternated runs; A = {a}, B = {b}")
print("%5s %-23s %11s %9s %9s %7s" % ("ranks", "op", "bytes", "A", "B", "B / A"))
for (np, op, size), v in sorted(cells.items()):
    ma, mb = statistics.median(v["a"]), statistics.median(v["b"])
    ratio = mb / ma if ma > 0 else None
    rows.append({"ranks": np, "op": op, "bytes": size, "a_busbw": v["a"], "b_busbw": v["b"],
                 "a_median": ma, "b_median": mb, "ratio": ratio})
    print("%5d %-23s %11d %9.2f %9.2f %7s" % (np, op, size, ma, mb,
                                              "-" if ratio is None else "%.3f" % ratio))
worst = min((r for r in rows if r["ratio"] is not None), key=lambda r: r["ratio"], default=None)
if worst:
    print("lowest B / A: %.3f (%d ranks, %s, %d bytes)" % (worst["ratio"], worst["ranks"],
          worst["op"], worst["bytes"]))
json.dump({"a": a, "b": b, "repeat": repeat, "cells": rows}, open(out, "w"), indent=1)
print("wrote", out)
PY
