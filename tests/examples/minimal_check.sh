#!/usr/bin/env bash
# The README's minimal program (examples/minimal.c): the README shows the file as it is,
# and it converges to the same losses alone and on 2 and 3 ranks (uneven rows: 8 over 3).
set -euo pipefail
fsdp2run=$1 minimal=$2 source=$3 readme=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The README's first C block is the file, line for line.
awk '/^```c$/ {inside = 1; next} inside && /^```$/ {exit} inside {print}' "$readme" >"$tmp/readme.c"
if ! diff -u "$source" "$tmp/readme.c"; then
    echo "README.md's program differs from examples/minimal.c (above)"; exit 1
fi

"$minimal" >"$tmp/ws1.txt"
cat "$tmp/ws1.txt"
grep -q "^step 29  loss 0.000000000$" "$tmp/ws1.txt" || { echo "ws 1 did not converge"; exit 1; }
for n in 2 3; do
    "$fsdp2run" --nproc-per-node "$n" "$minimal" >"$tmp/ws$n.txt" 2>&1
    for r in $(seq 0 $((n - 1))); do
        sed -n "s/^\[rank $r\] //p" "$tmp/ws$n.txt" >"$tmp/ws$n.r$r.txt"
        if ! diff -u "$tmp/ws1.txt" "$tmp/ws$n.r$r.txt"; then
            echo "rank $r of $n printed other losses than one rank did"; exit 1
        fi
    done
    echo "ws $n: every rank printed the losses of ws 1"
done
