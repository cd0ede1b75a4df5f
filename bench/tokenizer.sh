#!/usr/bin/env bash
# Tokenizer speed on one core: bench_tokenizer (lib/text) against Hugging Face `tokenizers`
# (bench/peer_tokenizer.py: encode per file, encode per entry, encode_batch of the entries)
# on the fortunes corpus with the two fixture tokenizers of tests/text, alternating, in
# one invocation. Prints each side's best rate and the ratio, and writes JSON.
#
#   bench/tokenizer.sh [--rounds 2] [--reps 2] [--python VENV/bin/python] [--json FILE]
#
# Rates are MB of text per second of CPU time of the process (one thread on our side;
# RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false on theirs), so a shared machine
# slows neither; both take the best pass after a first one (their caches warm).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2 reps=2 json=bench-results/tokenizer.json
python=${PYTHON:-}
[ -n "$python" ] || for p in /root/venv-peers/bin/python /root/venv-tok/bin/python python3; do
    if "$p" -c "import tokenizers" 2>/dev/null; then python=$p; break; fi
done
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--reps N] [--python PYTHON] [--json FILE]" >&2; exit 2 ;;
    esac
done
bench=./build/bench/bench_tokenizer
[ -x $bench ] || { echo "build first: ninja -C build bench/bench_tokenizer" >&2; exit 1; }
[ -n "$python" ] || { echo "no Python with tokenizers: pass --python" >&2; exit 1; }
toks=(--tokenizer gpt2=tests/text/gpt2/tokenizer.json --tokenizer llama3=tests/text/llama3/tokenizer.json)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for r in $(seq "$rounds"); do
    $bench "${toks[@]}" --reps "$reps" --json "$work/ours.$r.json" > /dev/null
    RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
        "$python" bench/peer_tokenizer.py "${toks[@]}" --reps "$reps" > "$work/theirs.$r.json"
done
mkdir -p "$(dirname "$json")"
"$python" - "$work" "$rounds" "$json" <<'PY'
import json, sys
work, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ours, theirs, version = {}, {}, None
for r in range(1, rounds + 1):
    for e in json.load(open(f"{work}/ours.{r}.json"))["results"]:
        k = (e["tokenizer"], e["calls"])
        ours[k] = max(ours.get(k, 0), e["warm_mbps"])
    t = json.load(open(f"{work}/theirs.{r}.json"))
    version = t["tokenizers"]
    for e in t["results"]:
        k = (e["tokenizer"], e["calls"])
        theirs[k] = max(theirs.get(k, 0), e["mbps"])
rows = []
print(f"one core, MB/s of text (best of {rounds} rounds); tokenizers {version}")
print(f"{'tokenizer':10} {'calls':8} {'libfsdp2':>9} {'tokenizers':>22} {'ratio':>6}")
for (tok, calls), mbps in sorted(ours.items()):
    peer = "entries_batch" if calls == "entries" else calls
    for p in ([calls, peer] if peer != calls else [calls]):
        theirs_mbps = theirs[(tok, p)]
        label = f"{theirs_mbps:.1f} ({'encode_batch' if p == 'entries_batch' else 'encode'})"
        print(f"{tok:10} {calls:8} {mbps:9.1f} {label:>22} {mbps / theirs_mbps:6.2f}")
        rows.append({"tokenizer": tok, "calls": calls, "peer_calls": p, "ours_mbps": mbps,
                     "tokenizers_mbps": theirs_mbps, "ratio": mbps / theirs_mbps})
json.dump({"tokenizers": version, "results": rows}, open(out, "w"), indent=1)
PY
