#!/usr/bin/env bash
# Installs the build into a temporary prefix, runs each installed tool's --help from
# there, then builds tests/install/app.c the way a user would (cc app.c $(pkg-config
# --cflags --libs fsdp2)), shared and static, runs both, and checks the headers also
# compile as C++.
set -euo pipefail
builddir=$1
srcdir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

meson install -C "$builddir" --destdir "$tmp/root" --no-rebuild --quiet >/dev/null
pc=$(find "$tmp/root" -name fsdp2.pc | head -n 1)
[ -n "$pc" ] || { echo "fsdp2.pc was not installed"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$pc")
export PKG_CONFIG_PATH=$(dirname "$pc")
pkgconf() { pkg-config --define-variable=prefix="$tmp/root$prefix" "$@" fsdp2; }
libdir=$(pkgconf --variable=libdir)

echo "prefix: $prefix  cflags: $(pkgconf --cflags)  libs: $(pkgconf --libs)"

# Each installed tool starts from the prefix without LD_LIBRARY_PATH (its rpath is
# relative to itself) and answers --help.
for tool in fsdp2run fsdp2-ckpt fsdp2-trace; do
    bin="$tmp/root$prefix/bin/$tool"
    [ -x "$bin" ] || { echo "$tool was not installed in $prefix/bin"; exit 1; }
    if ! env -u LD_LIBRARY_PATH "$bin" --help >/dev/null 2>"$tmp/err"; then
        echo "$tool --help failed from the prefix:"; cat "$tmp/err"; exit 1
    fi
    echo "$tool --help: OK"
done
cc -std=c11 -Wall -Wextra -Werror -pedantic "$srcdir/tests/install/app.c" -o "$tmp/app" \
    $(pkgconf --cflags) $(pkgconf --libs)
LD_LIBRARY_PATH="$libdir" "$tmp/app"
# (not `ldd | grep -q`: under pipefail, grep's early exit SIGPIPEs ldd and fails the test)
if grep -q "libfsdp2.so.0 => $libdir" <<<"$(LD_LIBRARY_PATH="$libdir" ldd "$tmp/app")"; then
    echo "shared: linked against the installed libfsdp2.so.0"
else
    echo "shared: app does not use the installed library:"; LD_LIBRARY_PATH="$libdir" ldd "$tmp/app"; exit 1
fi

static_libs=$(pkgconf --static --libs | sed 's/-lfsdp2//')
cc -std=c11 -Wall -Wextra -Werror "$srcdir/tests/install/app.c" -o "$tmp/app-static" \
    $(pkgconf --cflags) "$libdir/libfsdp2.a" $static_libs
"$tmp/app-static"
echo "static: OK"

echo '#include <fsdp2/fsdp2.h>' | c++ -x c++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only \
    $(pkgconf --cflags) -
echo "C++: headers compile"
