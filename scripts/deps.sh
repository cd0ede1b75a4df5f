#!/usr/bin/env bash
# Installs the Debian packages libfsdp2 needs, only those missing (quick when none are).
# Sourced by scripts/demo and scripts/test. (libudev-dev: static links of hwloc need -ludev;
# dataset-fashion-mnist: the main job's data, also read by the example's tests;
# fortunes: the GPT-2 example's default text and the tokenizer tests' corpus;
# libdnnl-dev: oneDNN, the layers' GEMMs (lib/nn);
# libpcre2-dev: the tokenizer's pre-tokenizer patterns (lib/text);
# librsvg2-bin, libxml2-utils: the tests render and validate fsdp2-trace's SVG;
# help2man: the tools' man pages; abigail-tools: the ABI check against abi/.)
set -euo pipefail

FSDP2_PACKAGES=(meson ninja-build pkg-config gcc g++ libc6-dev libucx-dev ucx-utils libhwloc-dev
                hwloc libudev-dev libcjson-dev check libopenblas-dev zlib1g-dev libpcre2-dev
                dataset-fashion-mnist fortunes libdnnl-dev librsvg2-bin libxml2-utils help2man abigail-tools)

# fsdp2_install_deps [PACKAGE...]: the given packages, or FSDP2_PACKAGES.
fsdp2_install_deps() {
    local missing=() wanted=("$@")
    [ ${#wanted[@]} -gt 0 ] || wanted=("${FSDP2_PACKAGES[@]}")
    for p in "${wanted[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "Installing missing packages (about a minute): ${missing[*]}"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || {
            echo "error: need root (or sudo) to install: ${missing[*]}" >&2
            return 1
        }
        sudo=sudo
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

# Prints ninja's progress ("[done/total] ...", its output on stdin) as one line that
# counts up on a terminal, or a line at every tenth of the steps otherwise.
fsdp2_build_progress() { # DIR
    local tty=0
    [ -t 1 ] && tty=1
    awk -v tty="$tty" -v dir="$1" '
        /^\[[0-9]+\/[0-9]+\] / {
            split(substr($1, 2, length($1) - 2), a, "/")
            done = a[1] + 0; total = a[2] + 0
            if (tty) {
                printf "\rbuilding %s: %d of %d steps", dir, done, total
                shown = 1
            } else if (int(10 * done / total) > tenth) {
                tenth = int(10 * done / total)
                printf "building %s: %d of %d steps\n", dir, done, total
            }
            fflush()
        }
        END { if (shown) printf "\n" }'
}

# Configures (once) and builds a build directory: fsdp2_build DIR [meson options...]
# An existing directory gets the options again (meson configure), so a change of the
# options in these scripts reaches old build directories too. ninja's output goes to
# DIR/fsdp2-build.log; the terminal gets its progress, and the log's end if it fails.
# With FSDP2_BUILD_SUITE=NAME it builds only the programs of that suite's tests (run
# them with meson test --no-rebuild --suite NAME).
fsdp2_build() {
    local dir=$1
    shift
    # meson finds nvcc only on PATH: add CUDA's bin when it is not there already.
    local cuda_bin="${CUDA_HOME:-/usr/local/cuda}/bin"
    if ! command -v nvcc >/dev/null && [ -x "$cuda_bin/nvcc" ]; then
        export PATH="$PATH:$cuda_bin"
    fi
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || {
            cat "$dir.setup.log" >&2
            return 1
        }
        rm -f "$dir.setup.log"
    elif [ $# -gt 0 ]; then
        meson configure "$dir" "$@" >/dev/null
    fi
    local log="$dir/fsdp2-build.log" start=$SECONDS targets=()
    if [ -n "${FSDP2_BUILD_SUITE:-}" ]; then
        # (python3 comes with meson)
        mapfile -t targets < <(meson introspect "$dir" --tests | python3 -c '
import json, os, sys
for t in json.load(sys.stdin):
    if "libfsdp2:" + sys.argv[2] in t["suite"]:
        print(os.path.relpath(t["cmd"][0], sys.argv[1]))' "$dir" "$FSDP2_BUILD_SUITE" | sort -u)
        if [ ${#targets[@]} -eq 0 ]; then
            echo "error: no test of $dir is in suite $FSDP2_BUILD_SUITE" >&2
            return 1
        fi
    fi
    if ! ninja -C "$dir" "${targets[@]}" 2>&1 | tee "$log" | fsdp2_build_progress "$dir"; then
        tail -n 40 "$log" >&2
        echo "error: building $dir failed (all of ninja's output: $log)" >&2
        return 1
    fi
    if ! grep -q "^ninja: no work to do" "$log"; then
        echo "built $dir in $((SECONDS - start)) s"
    fi
}
