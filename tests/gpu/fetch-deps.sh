#!/bin/sh
# Downloads (does not install) the Debian packages that tests/gpu/run.sh unpacks on the
# GPU machine, which has no package registry: Check (the main test suite's framework,
# a static library) with libsubunit, which it links, cJSON and PCRE2 (which the library
# needs: PCRE2 for lib/text's tokenizer) and zlib's headers, and pkgconf in case that
# machine has no pkg-config. They land in
# .deps/ at the repository root (git-ignored; name it in the device tool's `carry`).
#
# Run here, as root, with network access to the Debian mirrors.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
dest="$root/.deps"
packages="check libsubunit0 libsubunit-dev pkgconf pkgconf-bin libpkgconf3 libcjson1 libcjson-dev zlib1g-dev
          libpcre2-dev libpcre2-8-0"

mkdir -p "$dest"
cd "$dest"
rm -f ./*.deb
# shellcheck disable=SC2086
if ! apt-get download $packages; then
    apt-get update
    apt-get download $packages
fi
echo "fetch-deps: $(ls ./*.deb | wc -l) packages in $dest"
ls -l ./*.deb
