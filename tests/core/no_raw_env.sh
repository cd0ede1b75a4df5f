#!/bin/sh
# Every FSDP2_ variable the library reads goes through the env table (lib/core/env.c):
# a getenv of an FSDP2_ name anywhere else in lib/ is a variable the table, its
# validation, its log line and docs/environment.md would not know about.
# $1: the source root.
found=$(grep -rnE 'getenv *\( *"FSDP2' "$1/lib" --include='*.c' --include='*.h' --include='*.cu' |
        grep -v '^[^:]*/lib/core/env\.c:')
if [ -n "$found" ]; then
    echo "raw getenv of FSDP2_ variables outside lib/core/env.c:"
    echo "$found"
    exit 1
fi
echo "no raw getenv of FSDP2_ variables outside lib/core/env.c"
