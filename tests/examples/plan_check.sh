#!/usr/bin/env bash
# fsdp2-plan: the presets have the published parameter counts; its plan of GPT-2 tiny is
# what examples/lm measures when it trains for real at 2, 3 and 4 ranks (parameters,
# gradients and optimizer state plus FSDP's buffers, rank 0), to the byte, and so is its
# plan of a Hugging Face Llama directory (--model-dir), with and without LoRA adapters
# (--lora), whose Llama 3 8B count is peft's; a safetensors
# file is read from its header alone; the JSON model format; bad input is refused naming
# it, with exit status 2.
set -euo pipefail
plan=$1 fsdp2run=$2 gpt2=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# Published sizes: GPT-2 (tied head) and Llama 3 (the models' config.json / model cards).
while read -r model want; do
    got=$("$plan" --model "$model" --ranks 8 --json-out | field "d['params']")
    [ "$got" = "$want" ] || fail "$model has $got parameters, want $want"
    echo "$model: $got parameters"
done <<'LIST'
gpt2-124m 124439808
gpt2-355m 354823168
gpt2-774m 774030080
gpt2-1.5b 1557611200
llama3-8b 8030261248
llama3-70b 70553706496
llama3-405b 405853388800
LIST

# The plan against a real run of the same model.
for n in 2 3 4; do
    "$fsdp2run" --nproc-per-node "$n" "$gpt2" --preset tiny --steps 1 --batch 12 \
        --data "$GPT2_CORPUS" --json "$tmp/run$n.json" >"$tmp/run$n.log" 2>&1 ||
        { cat "$tmp/run$n.log"; fail "examples/lm at $n ranks"; }
    real=$(field "d['records'][-1]['state_bytes'] + d['records'][-1]['fsdp_bytes']" <"$tmp/run$n.json")
    planned=$("$plan" --model gpt2-tiny --ranks "$n" --keep-last --json-out | field "d['memory']['total']")
    [ "$real" = "$planned" ] || fail "ws $n: planned $planned bytes, the run measured $real"
    echo "gpt2-tiny at $n ranks: planned = measured = $real bytes"
done

# A Hugging Face model directory (transformers' own tiny Llama: GQA, an untied head): the
# plan from config.json and the headers equals examples/lm's measured run on it.
llama_dir=$(dirname "$GPT2_CORPUS")/lm-init/llama
for n in 2 3; do
    "$fsdp2run" --nproc-per-node "$n" "$gpt2" --model "$llama_dir" --steps 1 --batch 6 \
        --seq-len 32 --data "$GPT2_CORPUS" --json "$tmp/llama$n.json" >"$tmp/llama$n.log" 2>&1 ||
        { cat "$tmp/llama$n.log"; fail "examples/lm --model at $n ranks"; }
    real=$(field "d['records'][-1]['state_bytes'] + d['records'][-1]['fsdp_bytes']" <"$tmp/llama$n.json")
    planned=$("$plan" --model-dir "$llama_dir" --ranks "$n" --keep-last --json-out |
              field "d['memory']['total']")
    [ "$real" = "$planned" ] || fail "llama dir at ws $n: planned $planned bytes, the run measured $real"
    echo "llama directory at $n ranks: planned = measured = $real bytes"
done
# and with LoRA adapters (peft's, on q_proj, v_proj and down_proj): the base frozen, the
# adapters in their blocks' units
"$fsdp2run" --nproc-per-node 2 "$gpt2" --model "$llama_dir" --adapter "$llama_dir-lora" \
    --steps 1 --batch 6 --seq-len 32 --data "$GPT2_CORPUS" --json "$tmp/lora.json" \
    >"$tmp/lora.log" 2>&1 || { cat "$tmp/lora.log"; fail "examples/lm --adapter at 2 ranks"; }
real=$(field "d['records'][-1]['state_bytes'] + d['records'][-1]['fsdp_bytes']" <"$tmp/lora.json")
planned=$("$plan" --model-dir "$llama_dir" --lora r=4,targets=q_proj,v_proj,down_proj \
          --ranks 2 --keep-last --json-out | field "d['memory']['total']")
[ "$real" = "$planned" ] || fail "llama with LoRA at ws 2: planned $planned bytes, the run measured $real"
echo "llama directory with LoRA at 2 ranks: planned = measured = $real bytes"
# Llama 3 8B with r 8 on q_proj and v_proj at 8 ranks: peft's 3,407,872 trained parameters,
# their AdamW state in MiB
out=$("$plan" --model llama3-8b --ranks 8 --lora r=8,targets=q_proj,v_proj --json-out)
[ "$(field "d['trained_params']" <<<"$out")" = 3407872 ] || fail "llama3-8b LoRA: trained params"
[ "$(field "d['memory']['optimizer_state']" <<<"$out")" = 3407872 ] ||
    fail "llama3-8b LoRA: optimizer state $(field "d['memory']" <<<"$out")"

# A safetensors file: the exported model, then its header alone (the data cut off).
"$gpt2" --preset tiny --steps 0 --data "$GPT2_CORPUS" --export "$tmp/tiny" \
    >"$tmp/export.log" 2>&1 || { cat "$tmp/export.log"; fail "export"; }
mv "$tmp/tiny/model.safetensors" "$tmp/tiny.safetensors"
whole=$("$plan" --safetensors "$tmp/tiny.safetensors" --ranks 2 --json-out | field "d['params']")
header=$(python3 -c "import struct,sys; print(8 + struct.unpack('<Q', open(sys.argv[1], 'rb').read(8))[0])" "$tmp/tiny.safetensors")
head -c "$header" "$tmp/tiny.safetensors" >"$tmp/header.safetensors"
cut=$("$plan" --safetensors "$tmp/header.safetensors" --ranks 2 --json-out | field "d['params']")
preset=$("$plan" --model gpt2-tiny --ranks 2 --json-out | field "d['params']")
# the export writes the tied head once (as Hugging Face does), like the preset
[ "$whole" = "$preset" ] && [ "$cut" = "$preset" ] ||
    fail "safetensors: $whole parameters (header alone: $cut), the preset has $preset"
echo "safetensors: $whole parameters from the header alone"

# The JSON model format: one [10, 3] weight on 4 ranks (the library's test does it by hand).
cat >"$tmp/model.json" <<'JSON'
{"params": [{"name": "layer.w", "shape": [10, 3], "dtype": "f32"},
            {"name": "layer.frozen", "shape": [4], "requires_grad": false}]}
JSON
out=$("$plan" --json "$tmp/model.json" --ranks 4 --rank 3 --units every --json-out)
[ "$(field "d['trained_params']" <<<"$out")" = 30 ] || fail "json model: trained params"
[ "$(field "d['params']" <<<"$out")" = 34 ] || fail "json model: params"
echo "json model: OK"

# Refusals: exit 2 and a message naming the bad value.
refused() { # refused NEEDLE ARGS...
    local needle=$1 rc=0
    shift
    "$plan" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    [ "$rc" = 2 ] || fail "fsdp2-plan $* exited $rc, want 2"
    grep -qF -- "$needle" "$tmp/err" || { cat "$tmp/err"; fail "fsdp2-plan $*: no '$needle'"; }
}
refused "'gpt3' is not a preset" --model gpt3
refused "--mesh 'x' is not R,S" --model gpt2-tiny --mesh x
refused "--rank 4 is not in 0..3" --model gpt2-tiny --ranks 4 --rank 4
refused "reshard_after_forward 3" --model gpt2-tiny --ranks 4 --reshard-after-forward 3
refused "no model" --ranks 4
printf 'xxxxxxxx{' >"$tmp/bad.safetensors"
refused "not a safetensors file" --safetensors "$tmp/bad.safetensors"
refused "--device-memory '80XB'" --model gpt2-tiny --device-memory 80XB
refused "target 'qkv' matches no 2-D weight" --model llama3-8b --lora r=8,targets=qkv
refused "target 'lm_head' is lm_head.weight, tied to wte.weight" --model gpt2-tiny \
    --lora r=8,targets=lm_head
refused "r '0' is not a positive integer" --model gpt2-tiny --lora r=0,targets=c_attn
echo "refusals: OK"
