#!/usr/bin/env python3
"""The peer of bench_tokenizer: Hugging Face `tokenizers` encoding the same corpus on one
core (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false; bench/tokenizer.sh sets them).
Rates are MB of the files' bytes per second of process CPU time, best of --reps passes
after a first one, for encode() per file, encode() per entry and encode_batch() of all
entries. Writes JSON to stdout.

    peer_tokenizer.py --tokenizer NAME=PATH [...] [--corpus DIR] [--reps N]"""
import argparse
import glob
import json
import os
import time

import tokenizers
from tokenizers import Tokenizer


def corpus(directory):
    texts, size = [], 0
    for p in sorted(glob.glob(directory + "/*")):
        if p.endswith(".dat") or os.path.islink(p) or not os.path.isfile(p):
            continue
        data = open(p, "rb").read()
        size += len(data)
        texts.append(data.decode("utf-8", errors="replace"))
    return texts, size


def best(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        n = fn()
        times.append(time.process_time() - t0)
    return min(times), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", action="append", required=True)
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    texts, size = corpus(a.corpus)
    entries = []
    for t in texts:
        parts = t.split("\n%\n")
        entries += [p + "\n" for p in parts[:-1]] + [parts[-1]]
    results = []
    for spec in a.tokenizer:
        name, path = spec.split("=", 1)
        tok = Tokenizer.from_file(path)
        runs = {
            "files": lambda: sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts),
            "entries": lambda: sum(len(tok.encode(e, add_special_tokens=False).ids) for e in entries),
            "entries_batch": lambda: sum(len(e.ids) for e in tok.encode_batch(entries, add_special_tokens=False)),
        }
        for calls, fn in runs.items():
            secs, n = best(fn, a.reps)
            results.append({"tokenizer": name, "calls": calls, "ids": n, "mbps": size / 1e6 / secs})
    print(json.dumps({"tokenizers": tokenizers.__version__, "bytes": size, "results": results}))


if __name__ == "__main__":
    main()
