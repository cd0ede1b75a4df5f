#!/usr/bin/env bash
# Builds libfsdp2 with CUDA and runs the whole test suite on a GPU machine.
#
# Run from the repository root on the GPU machine (device tool: carry [".deps"], after
# tests/gpu/fetch-deps.sh has filled .deps/ here):
#     tests/gpu/run.sh              build in build-gpu/, run `meson test`, summary last
#     tests/gpu/run.sh --deps-only  only unpack .deps/ and check pkg-config finds Check
#     FSDP2_GPU_SUITES="gpu cuda" tests/gpu/run.sh   only those meson suites
#     FSDP2_GPU_SETUP_ARGS="-Dexamples=false" tests/gpu/run.sh   more meson setup options
#
# That machine has CUDA, NCCL, Python with meson and ninja from pip, and no package
# registry. Check, cJSON and zlib come as .debs unpacked with dpkg -x (or ar + tar) into
# a private prefix whose .pc files are rewritten to point there. The build is release
# without -Werror: that machine's gcc is newer than the one CI holds the code to. NCCL is looked for under CUDA,
# in the system and in Python's nvidia-nccl wheel; where it is not under CUDA_HOME, a
# small overlay (include/ and lib/ of symlinks) is made CUDA_HOME for meson.build's NCCL
# lookup. If Check cannot be had, the library is built without the Check suite and the
# GPU test is compiled by hand, so the GPU is still tested.
#
# Writes the test log (and build logs on failure) to "$OUT" when OUT is set. Exit status:
# 0 when every step passed, 1 otherwise.
set -u

root=$(pwd)
if [ ! -f "$root/meson.build" ] || [ ! -d "$root/lib/cuda" ]; then
    echo "run.sh: run me from the repository root (found no meson.build / lib/cuda here)" >&2
    exit 2
fi
deps_dir="$root/.deps"
prefix="${FSDP2_DEPS_PREFIX:-/tmp/fsdp2-deps}"
build="$root/build-gpu"
multiarch=x86_64-linux-gnu
summary=()
failed=0

step() { printf '\n== %s\n' "$*"; }
record() { # record STEP RESULT DETAIL
    summary+=("$1"$'\t'"$2"$'\t'"$3")
    [ "$2" = FAIL ] && failed=1
    return 0
}

print_summary() {
    printf '\n==================== summary ====================\n'
    printf '%-28s %-6s %s\n' step result detail
    printf '%-28s %-6s %s\n' ---------------------------- ------ ------------------------
    local row
    for row in "${summary[@]}"; do
        IFS=$'\t' read -r s r d <<<"$row"
        printf '%-28s %-6s %s\n' "$s" "$r" "$d"
    done
}

copy_out() { # copy_out FILE [NAME]
    [ -n "${OUT:-}" ] && [ -f "$1" ] && cp "$1" "$OUT/${2:-$(basename "$1")}"
    return 0
}

# ---- tools ------------------------------------------------------------------------

setup_tools() {
    step "tools"
    local scripts
    scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)
    [ -n "$scripts" ] && PATH="$scripts:$PATH"
    PATH="$(dirname "$(command -v python3)"):$PATH"
    if [ -z "${CUDA_HOME:-}" ] || [ ! -x "${CUDA_HOME}/bin/nvcc" ]; then
        if command -v nvcc >/dev/null; then
            CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
        else
            CUDA_HOME=/usr/local/cuda
        fi
    fi
    export CUDA_PATH="$CUDA_HOME" PATH="$CUDA_HOME/bin:$PATH"
    if command -v meson >/dev/null; then
        MESON=(meson)
    elif python3 -c 'import mesonbuild' 2>/dev/null; then
        MESON=(python3 -m mesonbuild.mesonmain)
    else
        record tools FAIL "no meson (pip install meson)"
        return 1
    fi
    command -v ninja >/dev/null || { record tools FAIL "no ninja"; return 1; }
    command -v nvidia-smi >/dev/null && nvidia-smi -L
    echo "CUDA_HOME=$CUDA_HOME"
    nvcc --version | tail -1
    cc --version | head -1
    echo "meson $("${MESON[@]}" --version), ninja $(ninja --version)"
    record tools ok "meson $("${MESON[@]}" --version), $(nvcc --version | grep -o 'release [0-9.]*')"
}

# ---- NCCL -----------------------------------------------------------------------------

# Prints "INCLUDE_DIR LIB_DIR" of the first NCCL found.
find_nccl() {
    local dirs=("$CUDA_HOME/include $CUDA_HOME/lib64" "$CUDA_HOME/include $CUDA_HOME/lib"
                "/usr/include /usr/lib/$multiarch" "/usr/local/include /usr/local/lib")
    local wheel
    wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
    [ -n "$wheel" ] && dirs+=("$wheel/include $wheel/lib")
    local d inc lib
    for d in "${dirs[@]}"; do
        read -r inc lib <<<"$d"
        if [ -f "$inc/nccl.h" ] && compgen -G "$lib/libnccl.so*" >/dev/null; then
            echo "$inc $lib"
            return 0
        fi
    done
    return 1
}

setup_nccl() {
    step "NCCL"
    local found inc lib
    if ! found=$(find_nccl); then
        record nccl FAIL "nccl.h + libnccl.so not found (CUDA_HOME, /usr, nvidia-nccl wheel)"
        return 1
    fi
    read -r inc lib <<<"$found"
    echo "NCCL: $inc, $lib"
    export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
    if [ "$inc" = "$CUDA_HOME/include" ] && [ -e "$lib/libnccl.so" ] &&
       { [ "$lib" = "$CUDA_HOME/lib64" ] || [ "$lib" = "$CUDA_HOME/lib" ]; }; then
        record nccl ok "$lib"
        return 0
    fi
    # meson.build looks for NCCL under CUDA_HOME only: give it a CUDA_HOME with both,
    # the toolkit's entries and NCCL's as symlinks (installed .pc files name it too).
    local overlay="$prefix/cuda-nccl" real="$CUDA_HOME" e d so
    rm -rf "$overlay"
    mkdir -p "$overlay/include" "$overlay/lib64"
    for e in "$real"/*; do
        case ${e##*/} in include | lib | lib64) ;; *) ln -s "$e" "$overlay/" ;; esac
    done
    for e in "$real"/include/*; do ln -sfn "$e" "$overlay/include/"; done
    for d in "$real/lib" "$real/lib64"; do
        [ -d "$d" ] || continue
        for e in "$d"/*; do ln -sfn "$e" "$overlay/lib64/"; done
    done
    ln -sfn "$overlay/lib64" "$overlay/lib"
    for e in "$inc"/nccl*.h; do ln -sfn "$e" "$overlay/include/"; done
    so=$(compgen -G "$lib/libnccl.so*" | sort | head -1)
    ln -sfn "$so" "$overlay/lib64/libnccl.so"
    export CUDA_HOME="$overlay" CUDA_PATH="$overlay"
    record nccl ok "$lib (via CUDA_HOME overlay $overlay)"
}

# ---- Check from .debs ------------------------------------------------------------------

# dpkg -x, or the .deb's ar members by hand (ar + tar, or Python when ar is missing).
unpack_deb() { # unpack_deb DEB DEST
    if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$1" "$2" && return 0
    fi
    python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, 'rb').read()
assert data[:8] == b'!<arch>\n', 'not an ar archive: ' + deb
pos = 8
while pos + 60 <= len(data):
    name = data[pos:pos + 16].decode().strip().rstrip('/')
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith('data.tar'):
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            tar.extractall(dest)
        break
    pos += 60 + size + (size & 1)
else:
    sys.exit('no data.tar member in ' + deb)
PY
}

setup_check() {
    step "Check (.debs from .deps/)"
    if ! compgen -G "$deps_dir/*.deb" >/dev/null; then
        record check WARN "no .deps/*.deb (run tests/gpu/fetch-deps.sh here, carry .deps)"
        return 1
    fi
    rm -rf "$prefix/root"
    mkdir -p "$prefix/root"
    local deb
    for deb in "$deps_dir"/*.deb; do
        unpack_deb "$deb" "$prefix/root" || { record check WARN "cannot unpack $deb"; return 1; }
    done
    local usr="$prefix/root/usr" pc_dir="$prefix/root/usr/lib/$multiarch/pkgconfig"
    # Debian's .pc files name the prefix (check) or absolute directories (libcjson).
    sed -i -e "s#^prefix=.*#prefix=$usr#" -e "s#^\(libdir\|includedir\)=/usr/#\1=$usr/#" \
        "$pc_dir"/*.pc
    export PKG_CONFIG_PATH="$pc_dir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export LD_LIBRARY_PATH="$usr/lib/$multiarch:${LD_LIBRARY_PATH:-}"
    if ! command -v pkg-config >/dev/null; then
        export PKG_CONFIG="$usr/bin/pkgconf"
    fi
    local pc="${PKG_CONFIG:-pkg-config}" flags
    if ! flags=$("$pc" --cflags --libs check 2>&1); then
        record check WARN "$pc cannot resolve check: $flags"
        return 1
    fi
    echo "$pc --cflags --libs check: $flags"
    case "$flags" in
    *"$usr"*) record check ok "$("$pc" --modversion check) in $usr" ;;
    *) record check WARN "check resolved outside the private prefix: $flags"; return 1 ;;
    esac
}

# ---- build and test ----------------------------------------------------------------------

build_and_test() { # build_and_test TESTS(true|false)
    step "meson setup (tests=$1)"
    local setup_args=(-Dcuda=enabled -Dbuildtype=release "-Dtests=$1" -Dwerror=false)
    # shellcheck disable=SC2206
    setup_args+=(${FSDP2_GPU_SETUP_ARGS:-})
    if [ -d "$build" ]; then setup_args+=(--reconfigure); fi
    if ! "${MESON[@]}" setup "$build" "${setup_args[@]}"; then
        copy_out "$build/meson-logs/meson-log.txt" setup-log.txt
        record "meson setup" FAIL "see setup-log.txt"
        return 1
    fi
    record "meson setup" ok "cuda=enabled, tests=$1"
    step "build"
    ninja -C "$build" 2>&1 | tee "$prefix/build.log"
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then
        copy_out "$prefix/build.log"
        record build FAIL "see build.log"
        return 1
    fi
    record build ok "$(ls "$build"/lib/libfsdp2.so* 2>/dev/null | head -1 | xargs -r basename)"
    # libfsdp2 links no CUDA library; the module does (lib/cuda/cuda_module.h).
    local needed
    needed=$(readelf -d "$build/lib/libfsdp2.so" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
             tr '\n' ' ')
    case "$needed" in
    *cuda* | *nccl*) record "libfsdp2.so needs" FAIL "$needed" ;;
    *) record "libfsdp2.so needs" ok "$needed" ;;
    esac
    [ -f "$build/lib/libfsdp2-cuda.so" ] && record "cuda module" ok "libfsdp2-cuda.so" ||
        record "cuda module" FAIL "not built"
    [ "$1" = true ] || return 0
    step "meson test"
    local suites=() s
    for s in ${FSDP2_GPU_SUITES:-}; do suites+=(--suite "$s"); done
    "${MESON[@]}" test -C "$build" --print-errorlogs "${suites[@]}"
    local rc=$?
    copy_out "$build/meson-logs/testlog.txt"
    copy_out "$build/meson-logs/testlog.json"
    record "meson test" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "exit $rc"
    test_rows
    run_bench
}

# Kernel bandwidth against a device-to-device copy in the same run (bench/kernels).
run_bench() {
    local exe="$build/bench/bench_kernels" dev
    [ -x "$exe" ] || return 0
    for dev in cuda:0 cpu; do
        step "bench_kernels --device $dev"
        local json="$prefix/bench_kernels_${dev%%:*}.json"
        "$exe" --device "$dev" --max-mib 256 --json "$json"
        local rc=$?
        if [ $rc -eq 0 ]; then
            copy_out "$json"
            record "bench $dev" ok "$(basename "$json")"
        elif [ $rc -eq 77 ]; then
            record "bench $dev" skip "device not available"
        else
            record "bench $dev" FAIL "exit $rc"
        fi
    done
}

# One summary row per test from meson's JSON log.
test_rows() {
    local json="$build/meson-logs/testlog.json" line
    [ -f "$json" ] || return 0
    while IFS= read -r line; do
        summary+=("$line")
    done < <(python3 - "$json" <<'PY'
import json, sys
for raw in open(sys.argv[1]):
    t = json.loads(raw)
    res = {'OK': 'ok', 'SKIP': 'skip', 'EXPECTEDFAIL': 'ok'}.get(t['result'], 'FAIL')
    suite, _, name = t['name'].rpartition(' / ')
    suite = suite.rpartition(':')[2]
    print('  %s/%s\t%s\t%s, %.1f s' % (suite, name, res, t['result'], t.get('duration') or 0))
PY
)
}

# Without Check: the GPU test alone, compiled against the static library.
run_gpu_test_by_hand() {
    step "test_cuda_runtime (by hand)"
    local exe="$prefix/test_cuda_runtime" cudalib
    cudalib=$(compgen -G "$CUDA_PATH/lib64/libcudart.so*" >/dev/null && echo "$CUDA_PATH/lib64" ||
              echo "$CUDA_PATH/lib")
    if ! cc -std=c11 -D_GNU_SOURCE -O2 -I"$root/include" -I"$build/include" -I"$root/lib" \
         "$root/tests/gpu/test_cuda_runtime.c" "$build/lib/libfsdp2.a" -L"$cudalib" \
         -Wl,-rpath,"$cudalib" -Wl,-rpath,"$build/lib" -lcudart -lstdc++ -lm -lpthread -ldl \
         -o "$exe"; then
        record "cuda_runtime" FAIL "does not compile"
        return 1
    fi
    "$exe" 2>&1 | tee "$prefix/test_cuda_runtime.log"
    local rc=${PIPESTATUS[0]}
    copy_out "$prefix/test_cuda_runtime.log"
    case $rc in
    0) record "  cuda_runtime" ok "by hand" ;;
    77) record "  cuda_runtime" skip "no CUDA device" ;;
    *) record "  cuda_runtime" FAIL "exit $rc" ;;
    esac
}

mkdir -p "$prefix"
trap print_summary EXIT

if [ "${1:-}" = "--deps-only" ]; then
    setup_check
    exit $?
fi

setup_tools || exit 1
setup_nccl || exit 1
if setup_check; then
    build_and_test true
else
    echo "run.sh: Check unavailable: building without the Check suite, GPU test by hand" >&2
    build_and_test false && run_gpu_test_by_hand
fi
exit $failed
