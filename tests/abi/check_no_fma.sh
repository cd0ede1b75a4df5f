#!/usr/bin/env bash
# No code in libfsdp2.so fuses a multiply and an add into one rounding (an FMA
# instruction): the library builds with -ffp-contract=off, so that each of its
# AVX-512/AVX2/baseline clones gives the same bits on every CPU (docs/architecture.md).
# This reads every clone, including those this machine's CPU never runs. A kernel that
# wants FMA on purpose must say why its numbers may differ by CPU, and change this check.
set -uo pipefail
objdump=$1 lib=$2
[ -f "$lib" ] || { echo "no library at $lib"; exit 1; }
found=$("$objdump" -d --no-show-raw-insn "$lib" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = $2 }
    /\tv?f(n)?m(add|sub)[0-9]*(sd|ss|pd|ps)/ { n[fn]++ }
    END { for (f in n) printf "%s %d\n", f, n[f] }')
if [ -n "$found" ]; then
    echo "FMA instructions in $lib (function, count):"
    echo "$found"
    exit 1
fi
echo "no FMA instruction in $lib"
