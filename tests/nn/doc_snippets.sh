#!/bin/sh
# Writes docs/nn.md's C blocks as one C file for test_nn_doc: the first block at file
# scope (it is a whole piece of a program), the second as the body of a function.
# usage: doc_snippets.sh docs/nn.md > out.c
set -eu
awk '
/^```c$/ { n++; inside = 1; if (n == 2) print "#include <stdlib.h>\nstatic void nn_doc_workspace(void)\n{"; next }
/^```$/ && inside { inside = 0; if (n == 2) print "    free(ws.data);\n}"; next }
inside && n <= 2 { print }
END { if (n < 2) { print "docs/nn.md has " n " C blocks; the test compiles 2" > "/dev/stderr"; exit 1 } }
' "$1"
