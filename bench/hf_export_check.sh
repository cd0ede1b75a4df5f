#!/usr/bin/env bash
# The library's Hugging Face exports, loaded by transformers (run by hand; needs a venv
# with torch and transformers, default /root/venv-peers): each fixture of
# tests/checkpoint/hf re-exported through fsdp2_hf_model_read and fsdp2_hf_writer in f32
# (one file) and bf16 (sharded), and the GPT-2 fixtures through examples/lm's
# --init-from and --export at ws 2, and the example's first loss from the hub-layout
# fixture against transformers'; then bench/hf_export_check.py. From the repository root
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
# the GPT-2 example's own import and export (--steps 0: the weights unchanged), at ws 2
# the example's binary: build/examples/lm (the causal-LM trainer) or build/examples/lm
gpt2=$PWD/build/examples/lm
[ -x "$gpt2" ] || gpt2=$PWD/build/examples/lm
if [ -x "$gpt2" ]; then
    for f in gpt2-f32 gpt2-hub-bf16-sharded; do
        "$PWD/build/tools/fsdp2run" --nproc-per-node 2 "$gpt2" --steps 0 --val-every 0 \
            --data tests/examples/gpt2_corpus.txt --init-from "tests/checkpoint/hf/$f" \
            --export "$work/example-$f" > /dev/null
        pairs+=("tests/checkpoint/hf/$f" "$work/example-$f")
    done
    # and its forward: the first loss from the hub-layout fixture against transformers'
    "$gpt2" --steps 1 --batch 4 --val-every 0 --data tests/examples/gpt2_corpus.txt \
        --init-from tests/checkpoint/hf/gpt2-hub-bf16-sharded --dump-batches "$work/batches" \
        --json "$work/loss.json" > /dev/null
    pairs+=(--loss tests/checkpoint/hf/gpt2-hub-bf16-sharded "$work/batches.0" "$work/loss.json")
fi
"$python" bench/hf_export_check.py "${pairs[@]}"
