#!/usr/bin/env bash
# Holds libfsdp2.so to the ABI recorded in abi/ (docs/abi.md): the soname is the
# recorded one, and abidiff finds no incompatible change (a removed or changed function
# or public type). Additions are compatible: they are printed, and the baseline is
# recorded again at the next release (scripts/abi-baseline).
set -uo pipefail
abidiff=$1 baseline=$2 lib=$3 headers=$4 generated=$5

want=$(sed -n "s/.*soname='\([^']*\)'.*/\1/p" "$baseline" | head -n 1)
have=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
echo "soname: $have (recorded: $want)"
[ "$have" = "$want" ] || { echo "the soname changed from $want to $have"; exit 1; }

"$abidiff" --headers-dir2 "$headers" --headers-dir2 "$generated" --drop-private-types \
    --no-show-locs "$baseline" "$lib"
rc=$?
if [ $((rc & 3)) -ne 0 ]; then
    echo "abidiff failed (exit $rc)"; exit 1
fi
if [ $((rc & 8)) -ne 0 ]; then
    echo "incompatible ABI change against $baseline (above): restore it, or change the" \
         "soname and record a new baseline (docs/abi.md)"
    exit 1
fi
if [ $((rc & 4)) -ne 0 ]; then
    echo "compatible ABI additions against $baseline (above)"
else
    echo "the ABI is the recorded one"
fi
