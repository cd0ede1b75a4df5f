#!/usr/bin/env bash
# examples/lm on Hugging Face model directories against PyTorch autograd on transformers'
# own models (lm_train_fixture.json, from make_lm_train_fixtures.py):
#   - a tiny LlamaForCausalLM (4 query heads over 2 key/value heads, an untied head, Llama
#     3's rope scaling) and a tiny GPT2LMHeadModel, both as transformers saved them
#     (lm-init/), train 20 AdamW steps on gpt2_corpus.txt at ws 1, 2 and 4 and reach
#     PyTorch's float64 losses within 1e-4 relative, and so does the Llama with activation
#     checkpointing and gradient accumulation; saved at ws 2 and resumed at ws 1, it
#     reaches the losses of a run without the break;
#   - with --param-dtype bf16 (ws 2) the losses stay within twice the spread PyTorch's own
#     bf16 recipes (autocast, and FSDP2's param_dtype bf16) show against float64, with the
#     GEMMs on f32 operands (FSDP2_NN_BF16_GEMM=off) and on bf16 ones (on: the linear
#     layers' and, the example computing in bf16, attention's; emulated where the CPU has
#     no bf16 kernels); and rounding the GEMMs' operands to bf16, which is
#     what autocast does to PyTorch's f32 step, moves our losses (on against off) by no
#     more than autocast's spread from float64;
#   - the Llama trained at ws 2 exports a directory that loads again (ws 1) and exports
#     the same bytes, with generation_config.json carried along; exported untrained from 2
#     ranks (each reading only its rows) and from 1, the bytes are the same;
#   - a model_type the library does not build is refused, naming it;
#   - llama-tiny with the Llama-3-style tokenizer of tests/text trains on its ids at ws 2,
#     exports the tokenizer and its bos/eos ids with the weights, and a directory holding
#     a tokenizer.json trains on it without --tokenizer; --token-cache writes a cache the
#     next run reads, to the same losses; a FIFO as --data is refused at once;
#   - LoRA: peft's adapters (lm-init/NAME-lora) on both models train 20 steps at ws 1, 2
#     and 4 to peft + PyTorch autograd's float64 losses within 1e-4; the base comes out
#     bit for bit as it went in; --save-adapter writes what --adapter reads back to the
#     same bytes; --export-merged equals peft's merge_and_unload within 1e-6; adapters
#     that do not fit the model, unknown targets and adapters without --lora are refused.
# usage: lm_check.sh FSDP2RUN LM TOKENIZER_JSON
set -euo pipefail
run=$1 lm=$2 tokenizer=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=$(python3 -c "import json, sys; print('\n'.join(json.load(open(sys.argv[1]))['flags']))" \
        "$here/lm_train_fixture.json")
mapfile -t common <<<"$flags"

train() { # arch ws json extra flags...
    local arch=$1 ws=$2 json=$3
    shift 3
    "$run" --nproc-per-node "$ws" "$lm" --model "$here/lm-init/$arch" "${common[@]}" \
        --json "$json" "$@" > "$json.log" 2>&1 || { cat "$json.log"; exit 1; }
}
for arch in llama gpt2; do
    for ws in 1 2 4; do
        train "$arch" "$ws" "$work/$arch-$ws.json"
    done
    FSDP2_NN_BF16_GEMM=off train "$arch" 2 "$work/$arch-bf16.json" --param-dtype bf16
    FSDP2_NN_BF16_GEMM=on train "$arch" 2 "$work/$arch-bf16-ops.json" --param-dtype bf16
    for ws in 1 2 4; do
        train "$arch" "$ws" "$work/$arch-lora-$ws.json" --adapter "$here/lm-init/$arch-lora"
    done
done
# Llama with activation checkpointing and 2 accumulated micro-batches (ws 2): the same
# losses. Saved after 12 steps at ws 2 and resumed at ws 1: the losses of a run without
# the break (a warmup of 20 steps makes the 12-step run's schedule the 20-step one's)
train llama 2 "$work/llama-ckpt.json" --activation-checkpointing --grad-accum 2
train llama 1 "$work/llama-whole.json" --warmup 20
"$run" --nproc-per-node 2 "$lm" --model "$here/lm-init/llama" "${common[@]}" --steps 12 \
    --warmup 20 --save "$work/saved" > "$work/save.log" 2>&1 || { cat "$work/save.log"; exit 1; }
train llama 1 "$work/llama-resumed.json" --warmup 20 --resume "$work/saved"
python3 - "$here/lm_train_fixture.json" "$work" <<'PY'
import json, sys
fixture, work = json.load(open(sys.argv[1]))["models"], sys.argv[2]
bad = 0
def losses(path):
    records = json.load(open(path))["records"]
    return [r["train_loss"] for r in records]
for arch, ref in fixture.items():
    want = ref["f64"]
    for run in [str(ws) for ws in (1, 2, 4)] + (["ckpt"] if arch == "llama" else []):
        records = json.load(open(f"{work}/{arch}-{run}.json"))["records"]
        if [r["step"] for r in records] != list(range(1, len(want) + 1)):
            print(f"FAIL {arch} {run}: steps {[r['step'] for r in records]}"); bad += 1
        for r in records:
            g, w = r["train_loss"], want[r["step"] - 1]
            if abs(g - w) > 1e-4 * abs(w):
                print(f"FAIL {arch} {run} step {r['step']}: loss {g!r}, PyTorch {w!r}"); bad += 1
whole = losses(f"{work}/llama-whole.json")
resumed = json.load(open(f"{work}/llama-resumed.json"))["records"]
if [r["step"] for r in resumed] != list(range(13, 21)):
    print(f"FAIL resumed: steps {[r['step'] for r in resumed]}"); bad += 1
for r in resumed:
    if abs(r["train_loss"] - whole[r["step"] - 1]) > 1e-5 * whole[r["step"] - 1]:
        print(f"FAIL resumed step {r['step']}: {r['train_loss']}, unbroken {whole[r['step'] - 1]}")
        bad += 1
def distance(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")
for arch, ref in fixture.items():
    if arch.endswith("-lora"):
        continue
    want = ref["f64"]
    autocast = distance(ref["bf16_autocast"], want)
    spread = max(autocast, distance(ref["bf16_params"], want))
    off, on = losses(f"{work}/{arch}-bf16.json"), losses(f"{work}/{arch}-bf16-ops.json")
    for what, got in (("f32", off), ("bf16", on)):
        worst = distance(got, want)
        print(f"{arch}: bf16 parameters, {what} GEMM operands: {worst:.2e} from float64; "
              f"PyTorch's bf16 spread {spread:.2e}")
        if worst > 2 * spread:
            print(f"FAIL {arch} bf16 ({what} operands): {worst:.3g} past twice the spread "
                  f"{spread:.3g}"); bad += 1
    moved = distance(on, off)
    print(f"{arch}: bf16 GEMM operands move the losses {moved:.2e}; autocast's spread "
          f"{autocast:.2e}")
    if moved > autocast:
        print(f"FAIL {arch}: bf16 operands moved the losses {moved:.3g}, past autocast's "
              f"{autocast:.3g}"); bad += 1
sys.exit(1 if bad else 0)
PY

# untrained exports from 2 ranks and from 1 carry the same bytes; trained at 2 ranks, the
# export loads again and re-exports the same bytes
"$run" --nproc-per-node 2 "$lm" --model "$here/lm-init/llama" "${common[@]}" --steps 0 \
    --export "$work/init2" > "$work/init2.log" 2>&1 || { cat "$work/init2.log"; exit 1; }
"$lm" --model "$here/lm-init/llama" "${common[@]}" --steps 0 --export "$work/init1" \
    > "$work/init1.log" 2>&1 || { cat "$work/init1.log"; exit 1; }
cmp "$work/init1/model.safetensors" "$work/init2/model.safetensors"
"$run" --nproc-per-node 2 "$lm" --model "$here/lm-init/llama" "${common[@]}" --steps 3 \
    --export "$work/trained2" > "$work/export2.log" 2>&1 || { cat "$work/export2.log"; exit 1; }
"$lm" --model "$work/trained2" "${common[@]}" --steps 0 --export "$work/again" \
    > "$work/again.log" 2>&1 || { cat "$work/again.log"; exit 1; }
cmp "$work/trained2/model.safetensors" "$work/again/model.safetensors"
cmp "$here/lm-init/llama/generation_config.json" "$work/again/generation_config.json"
grep -q '"model_type":[[:space:]]*"llama"' "$work/again/config.json" || { cat "$work/again/config.json"; exit 1; }

# a model_type the library does not build: refused naming it, exit status 1
mkdir "$work/mistral"
sed 's/"llama"/"mistral"/' "$here/lm-init/llama/config.json" > "$work/mistral/config.json"
cp "$here/lm-init/llama/model.safetensors" "$work/mistral/"
if "$lm" --model "$work/mistral" "${common[@]}" --steps 1 > "$work/mistral.log" 2>&1; then
    echo "FAIL: a mistral directory was trained"; exit 1
fi
grep -q "mistral" "$work/mistral.log" || { cat "$work/mistral.log"; exit 1; }
# a tokenizer: the preset takes its vocabulary, the export carries it and its bos/eos
tok=(--preset llama-tiny --data "$here/gpt2_corpus.txt" --seq-len 32 --batch 4 --val-every 0
     --log-every 1)
"$run" --nproc-per-node 2 "$lm" "${tok[@]}" --steps 2 --tokenizer "$tokenizer" \
    --token-cache "$work" --json "$work/tok1.json" --export "$work/tokexp" \
    > "$work/tok1.log" 2>&1 || { cat "$work/tok1.log"; exit 1; }
grep -q "vocab 4007" "$work/tok1.log" || { cat "$work/tok1.log"; exit 1; }
cmp "$tokenizer" "$work/tokexp/tokenizer.json"
grep -q '"bos_token_id":[[:space:]]*4000' "$work/tokexp/config.json" &&
    grep -q '"eos_token_id":[[:space:]]*4001' "$work/tokexp/config.json" ||
    { cat "$work/tokexp/config.json"; exit 1; }
ls "$work"/gpt2_corpus.txt.*.tokens > /dev/null
# the cache is read the second time, and the directory's tokenizer.json is found alone
"$lm" --model "$work/tokexp" --data "$here/gpt2_corpus.txt" --seq-len 32 --batch 4 \
    --val-every 0 --log-every 1 --steps 2 --token-cache "$work" --json "$work/tok2.json" \
    > "$work/tok2.log" 2>&1 || { cat "$work/tok2.log"; exit 1; }
grep -q "vocab 4007" "$work/tok2.log" || { cat "$work/tok2.log"; exit 1; }
python3 - "$work/tok1.json" <<'PY'
import json, sys
losses = [r["train_loss"] for r in json.load(open(sys.argv[1]))["records"]]
# ids of a 4007-token vocabulary: the first loss is near log(4007) = 8.30
assert len(losses) == 2 and abs(losses[0] - 8.30) < 0.1, losses
PY
# a FIFO as --data: refused at once, not read forever
mkfifo "$work/fifo"
if timeout 10 "$lm" "${tok[@]}" --steps 1 --data "$work/fifo" > "$work/fifo.log" 2>&1; then
    echo "FAIL: a FIFO was read as the corpus"; exit 1
fi
grep -q "neither a regular file nor a directory" "$work/fifo.log" || { cat "$work/fifo.log"; exit 1; }

# LoRA: the base unchanged by training its adapters; the adapters saved and read back; the
# merged export against peft's merge_and_unload
lora=(--model "$here/lm-init/llama" "${common[@]}")
"$lm" "${lora[@]}" --steps 0 --export "$work/base0" > "$work/base0.log" 2>&1 ||
    { cat "$work/base0.log"; exit 1; }
"$run" --nproc-per-node 2 "$lm" "${lora[@]}" --adapter "$here/lm-init/llama-lora" --steps 5 \
    --export "$work/base5" --save-adapter "$work/ad5" > "$work/lora5.log" 2>&1 ||
    { cat "$work/lora5.log"; exit 1; }
grep -q "1664 trained (LoRA adapters)" "$work/lora5.log" || { cat "$work/lora5.log"; exit 1; }
cmp "$work/base0/model.safetensors" "$work/base5/model.safetensors"
"$lm" "${lora[@]}" --adapter "$work/ad5" --steps 0 --save-adapter "$work/ad5again" \
    > "$work/ad5again.log" 2>&1 || { cat "$work/ad5again.log"; exit 1; }
cmp "$work/ad5/adapter_model.safetensors" "$work/ad5again/adapter_model.safetensors"
grep -q '"peft_type":[[:space:]]*"LORA"' "$work/ad5/adapter_config.json" ||
    { cat "$work/ad5/adapter_config.json"; exit 1; }
for arch in llama gpt2; do
    "$run" --nproc-per-node 2 "$lm" --model "$here/lm-init/$arch" "${common[@]}" --steps 0 \
        --adapter "$here/lm-init/$arch-lora" --export-merged "$work/merged-$arch" \
        > "$work/merged-$arch.log" 2>&1 || { cat "$work/merged-$arch.log"; exit 1; }
    python3 - "$work/merged-$arch/model.safetensors" "$here/lm-init/$arch-lora-merged.safetensors" <<'PY'
import json, struct, sys
def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    out = {}
    for name, t in json.loads(data[8:8 + n]).items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        b, e = t["data_offsets"]
        shape = t["shape"]
        values = struct.unpack(f"<{(e - b) // 4}f", data[8 + n + b:8 + n + e])
        conv1d = name.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                "mlp.c_proj.weight"))
        out[name.removeprefix("transformer.")] = (shape, values, conv1d)
    return out
ours, peft = read(sys.argv[1]), read(sys.argv[2])
assert set(ours) == set(peft), set(ours) ^ set(peft)
worst = 0.0
for name, (shape, v, _) in peft.items():
    s2, w, _ = ours[name]
    assert s2 == shape, (name, s2, shape)
    worst = max(worst, max(abs(a - b) for a, b in zip(v, w)))
print(f"{sys.argv[1]}: merged weights within {worst:.2e} of peft's merge_and_unload")
sys.exit(0 if worst <= 1e-6 else 1)
PY
done

# adapters that do not fit the model, unknown targets, adapters without --lora: refused
refuse() { # needle, args...
    local needle=$1
    shift
    if "$lm" "${common[@]}" --steps 1 "$@" > "$work/refused.log" 2>&1; then
        echo "FAIL: accepted: $*"; exit 1
    fi
    grep -q -- "$needle" "$work/refused.log" || { cat "$work/refused.log"; exit 1; }
}
refuse "target 'c_attn' matches no linear layer" --model "$here/lm-init/llama" \
    --adapter "$here/lm-init/gpt2-lora"
refuse "q_proj.lora_A.weight is \[4, 32\] where the model's is \[4, 128\]" \
    --preset llama-tiny --layers 2 --adapter "$here/lm-init/llama-lora"
refuse "matches no linear layer; the model's linear layers: q_proj" \
    --model "$here/lm-init/llama" --lora r=4,targets=q_proj,qkv
refuse "disagrees with --adapter" --model "$here/lm-init/llama" --lora r=8,targets=q_proj \
    --adapter "$here/lm-init/llama-lora"
refuse "r=20 is larger than model.layers.0.self_attn.k_proj \[16, 32\] allows (16)" \
    --model "$here/lm-init/llama" --lora r=20,targets=k_proj
refuse "--save-adapter needs adapters" --model "$here/lm-init/llama" --save-adapter "$work/x"

echo "lm: Llama and GPT-2 directories reach PyTorch's losses at ws 1, 2 and 4, bf16 within" \
     "PyTorch's spread, exports round-trip, tokenizers train and travel with the export"
