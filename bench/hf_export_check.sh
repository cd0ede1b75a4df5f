#!/usr/bin/env bash
# The library's Hugging Face exports, loaded by transformers (run by hand; needs a venv
# with torch and transformers, default /root/venv-peers): each fixture of
# tests/checkpoint/hf re-exported through fsdp2_hf_model_read and fsdp2_hf_writer in f32
# (one file) and bf16 (sharded), then bench/hf_export_check.py. From the repository root
# after ninja -C build:
#   bench/hf_export_check.sh [PYTHON]
set -euo pipefail
python=${1:-/root/venv-peers/bin/python}
tool=$PWD/build/bench/bench_hf_reexport
[ -x "$tool" ] || { echo "build first: ninja -C build" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pairs=()
for f in gpt2-f32 gpt2-hub-bf16-sharded llama-f32 llama-bf16; do
    src=tests/checkpoint/hf/$f
    "$tool" "$src" "$work/$f-f32" f32 > /dev/null
    "$tool" "$src" "$work/$f-bf16" bf16 20000 > /dev/null
    pairs+=("$src" "$work/$f-f32" "$src" "$work/$f-bf16")
done
ls "$work/gpt2-f32-bf16"
"$python" bench/hf_export_check.py "${pairs[@]}"
