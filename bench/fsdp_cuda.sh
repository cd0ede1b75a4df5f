#!/usr/bin/env bash
# The FSDP step on one GPU against PyTorch's fully_shard in the same run: runs
# bench_fsdp_cuda_step and bench/peer_fsdp_cuda.py on the same shapes (extra arguments
# go to both), then prints both and the ratios (ours / torch: under 1 is better for us).
#
#     bench/fsdp_cuda.sh [BUILD_DIR] [--layers 8 --rows 4096 --cols 4095 --steps 20]
#
# Writes BUILD_DIR/fsdp_cuda.json (both results and the ratios). Needs a GPU and a
# python3 with torch (2.6 or later for fully_shard).
set -euo pipefail
build=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then build=$1; shift; fi
here=$(cd "$(dirname "$0")" && pwd)
ours=$(mktemp) theirs=$(mktemp)
trap 'rm -f "$ours" "$theirs"' EXIT
"$build/bench/bench_fsdp_cuda_step" "$@" --json "$ours"
python3 "$here/peer_fsdp_cuda.py" "$@" --json "$theirs"
python3 - "$ours" "$theirs" "$build/fsdp_cuda.json" <<'PY'
import json, sys
ours, theirs = (json.load(open(p)) for p in sys.argv[1:3])
ratio = {k: ours[k] / theirs[k] for k in ("median_ms", "best_ms", "mean_ms", "peak_bytes")}
print(f"{'ours / torch':26} {ratio['median_ms']:12.3f} {ratio['best_ms']:12.3f} "
      f"{ratio['mean_ms']:12.3f} {ratio['peak_bytes']:14.3f}")
json.dump({"libfsdp2": ours, "torch": theirs, "ratio": ratio}, open(sys.argv[3], "w"), indent=1)
print("wrote", sys.argv[3])
PY
