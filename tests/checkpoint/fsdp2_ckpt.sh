#!/usr/bin/env bash
# fsdp2-ckpt end to end, on a real checkpoint of the Fashion-MNIST example:
# inspect (text and JSON), verify, reshard 2 -> 4, consolidate both into safetensors
# files that a reader written here from the format's spec (Python: struct + json) accepts
# and finds equal, a corrupted byte that verify reports, bad command lines, and the
# example resuming from the resharded checkpoint at 4 ranks.
#   fsdp2_ckpt.sh FSDP2RUN FASHION_MNIST FSDP2_CKPT
set -euo pipefail
run=$1
prog=$2
tool=$3
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    echo "SKIP: the Fashion-MNIST dataset is missing"
    exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$run" --nproc-per-node 2 "$prog" --model mlp --epochs 1 --limit 640 --save "$out/ckpt" >/dev/null
"$tool" inspect "$out/ckpt" > "$out/inspect.txt"
grep -q "saved by 2 ranks" "$out/inspect.txt" || fail "inspect: $(cat "$out/inspect.txt")"
grep -q "fc1.weight .*f32 .*\[512,784\]" "$out/inspect.txt" || fail "inspect lacks fc1.weight"
grep -q "optim.state.fc3.bias.square_avg" "$out/inspect.txt" || fail "inspect lacks the optimizer state"
"$tool" inspect "$out/ckpt" --json > "$out/inspect.json"
"$tool" verify "$out/ckpt" | grep -q ": ok (" || fail "verify of a good checkpoint"
"$tool" reshard "$out/ckpt" "$out/ckpt4" --world-size 4 >/dev/null
"$tool" verify "$out/ckpt4" >/dev/null || fail "verify of the resharded checkpoint"
[ "$(ls "$out/ckpt4" | grep -c '^rank-.*\.safetensors$')" = 4 ] || fail "reshard made $(ls "$out/ckpt4")"
"$tool" consolidate "$out/ckpt" "$out/a.safetensors" >/dev/null
"$tool" consolidate "$out/ckpt4" "$out/b.safetensors" >/dev/null

python3 - "$out" <<'PY'
import json, struct, sys
out = sys.argv[1]
info = json.load(open(f"{out}/inspect.json"))
assert info["world_size"] == 2 and info["version"] == 1, info
names = {t["name"] for t in info["tensors"]}
assert "fc1.weight" in names and "optim.state.fc1.weight.acc_delta" in names, names

SIZES = {"F32": 4, "F64": 8, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "U8": 1}
def read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    assert (8 + n) % 8 == 0, "data not 8-byte aligned"
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors, end = {}, 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"] if kv[0] != "__metadata__" else [-1]):
        if name == "__metadata__":
            continue
        b, z = e["data_offsets"]
        count = 1
        for d in e["shape"]:
            count *= d
        assert b == end and z - b == count * SIZES[e["dtype"]], (name, e)
        end = z
        tensors[name] = (e["dtype"], e["shape"], body[b:z])
    assert end == len(body), "trailing bytes"
    return tensors
a, b = read(f"{out}/a.safetensors"), read(f"{out}/b.safetensors")
assert a.keys() == b.keys() and a["fc1.weight"][1] == [512, 784], a.keys()
for k in a:
    assert a[k] == b[k], f"{k} differs after resharding"
print(f"ok: {len(a)} tensors equal in both consolidated files")
PY

# One flipped byte in a rank file's data: verify names the checksum.
cp -r "$out/ckpt" "$out/bad"
size=$(stat -c %s "$out/bad/rank-00001.safetensors")
printf '\x5a' | dd of="$out/bad/rank-00001.safetensors" bs=1 seek=$((size - 100)) conv=notrunc 2>/dev/null
if "$tool" verify "$out/bad" > "$out/verify.txt" 2>&1; then fail "verify passed a corrupted checkpoint"; fi
grep -q "checksum mismatch" "$out/verify.txt" || fail "verify: $(cat "$out/verify.txt")"
# Bad command lines exit 2; a missing checkpoint exits 1.
set +e
"$tool" reshard "$out/ckpt" "$out/x" --world-size 0 >/dev/null 2>&1; [ $? = 2 ] || fail "world size 0"
"$tool" frobnicate "$out/ckpt" >/dev/null 2>&1; [ $? = 2 ] || fail "unknown command"
"$tool" verify "$out/none" >/dev/null 2>&1; [ $? = 1 ] || fail "missing checkpoint"
set -e
# The example goes on from the resharded checkpoint at 4 ranks.
"$run" --nproc-per-node 4 "$prog" --model mlp --epochs 2 --limit 640 --resume "$out/ckpt4" \
    | grep -q "resumed from .*epoch 1 done, saved by 4 ranks" || fail "resume from the resharded checkpoint"
echo "fsdp2-ckpt: ok"
