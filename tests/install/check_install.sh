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
for tool in fsdp2run fsdp2-ckpt fsdp2-trace fsdp2-plan; do
    bin="$tmp/root$prefix/bin/$tool"
    [ -x "$bin" ] || { echo "$tool was not installed in $prefix/bin"; exit 1; }
    if ! env -u LD_LIBRARY_PATH "$bin" --help >/dev/null 2>"$tmp/err"; then
        echo "$tool --help failed from the prefix:"; cat "$tmp/err"; exit 1
    fi
    echo "$tool --help: OK"
    # its man page, made from --help by help2man (in the README's dependencies)
    if command -v help2man >/dev/null; then
        page=$(find "$tmp/root" -path "*/man1/$tool.1" | head -n 1)
        [ -n "$page" ] || { echo "$tool.1 was not installed"; exit 1; }
        name=$(sed -n '/^\.SH NAME/{n;p;q}' "$page" | tr -d '\\')
        case "$name" in
        "$tool - "*) ;;
        *) echo "$page is not $tool's man page (NAME: $name):"; head -5 "$page"; exit 1 ;;
        esac
        echo "$tool.1: OK ($(dirname "${page#"$tmp/root"}"))"
    fi
done
# libfsdp2.so links no CUDA library; a CUDA build installs the module beside it, which
# exports its init entry point only.
needed=$(readelf -d "$libdir/libfsdp2.so.0" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "libfsdp2.so.0 needs: $needed"
case "$needed" in
*cuda* | *nccl* | *nvidia*) echo "libfsdp2.so.0 links a CUDA library"; exit 1 ;;
esac
module="$libdir/libfsdp2-cuda.so"
built_cuda=$(sed -n 's/^#define FSDP2_BUILT_WITH_CUDA //p' "$(pkgconf --variable=includedir)/fsdp2/version.h")
if [ "$built_cuda" = 1 ]; then
    [ -f "$module" ] || { echo "a CUDA build did not install $module"; exit 1; }
    exported=$(nm -D --defined-only "$module" | awk '{print $3}' | tr '\n' ' ')
    [ "$exported" = "fsdp2_cuda_module_init " ] ||
        { echo "the module exports more than its init entry point: $exported"; exit 1; }
    echo "module: $(basename "$module") exports $exported"
elif [ -e "$module" ]; then
    echo "a build without CUDA installed $module"; exit 1
fi

cc -std=c11 -Wall -Wextra -Werror -pedantic "$srcdir/tests/install/app.c" -o "$tmp/app" \
    $(pkgconf --cflags) $(pkgconf --libs)
LD_LIBRARY_PATH="$libdir" "$tmp/app" | tee "$tmp/app.out"
# The installed libfsdp2.so finds the installed module beside itself: cuda:0 is there,
# or what is missing is the driver or a GPU, never the module.
if [ "$built_cuda" = 1 ] && grep -q "could not be loaded" "$tmp/app.out"; then
    echo "the installed libfsdp2 did not load the installed module"; exit 1
fi
if [ "$built_cuda" != 1 ] && ! grep -q "could not be loaded" "$tmp/app.out"; then
    echo "a build without CUDA did not say that the CUDA module is missing"; exit 1
fi
# (not `ldd | grep -q`: under pipefail, grep's early exit SIGPIPEs ldd and fails the test)
if grep -q "libfsdp2.so.0 => $libdir" <<<"$(LD_LIBRARY_PATH="$libdir" ldd "$tmp/app")"; then
    echo "shared: linked against the installed libfsdp2.so.0"
else
    echo "shared: app does not use the installed library:"; LD_LIBRARY_PATH="$libdir" ldd "$tmp/app"; exit 1
fi

static_libs=$(pkgconf --static --libs | sed 's/-lfsdp2//')
cc -std=c11 -Wall -Wextra -Werror "$srcdir/tests/install/app.c" -o "$tmp/app-static" \
    $(pkgconf --cflags) "$libdir/libfsdp2.a" $static_libs
LD_LIBRARY_PATH="$libdir" "$tmp/app-static" | tee "$tmp/app-static.out"
if [ "$built_cuda" = 1 ] && grep -q "could not be loaded" "$tmp/app-static.out"; then
    echo "a program linked with libfsdp2.a did not load the module on its library path"; exit 1
fi
echo "static: OK"

echo '#include <fsdp2/fsdp2.h>' | c++ -x c++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only \
    $(pkgconf --cflags) -
echo "C++: headers compile"
