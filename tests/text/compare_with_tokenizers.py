#!/usr/bin/env python3
"""Compares lib/text with Hugging Face tokenizers on any tokenizer.json at hand (a real
GPT-2 or Llama 3 file, say), over the fortunes corpus and make_fixtures.py's hostile
texts, in the three modes of the fixtures. Not part of the test suite (it needs Python
and the file); run by hand after building:

    /root/venv-tok/bin/python tests/text/compare_with_tokenizers.py PATH/tokenizer.json

Prints one line per mode and exits 1 if any input's ids differ."""
import glob
import os
import struct
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import make_fixtures  # noqa: E402


def fnv64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    path = sys.argv[1]
    exe = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "../../build/tests/text/tokenize_files")
    tok = Tokenizer.from_file(path)
    work = tempfile.mkdtemp()
    files = make_fixtures.corpus_files()
    for i, t in enumerate(make_fixtures.hostile_texts()):
        p = os.path.join(work, "hostile%02d" % i)
        open(p, "wb").write(t)
        files.append(p)
    bad = 0
    for mode, args in (("plain", []), ("special", ["--special"]), ("text", ["--as-text"])):
        ours = subprocess.run([exe] + args + [path] + files, check=True, capture_output=True,
                              text=True).stdout.split("\n")
        tok.encode_special_tokens = mode == "text"
        differ = 0
        for p, line in zip(files, ours):
            ids = tok.encode(open(p, "rb").read().decode("utf-8", errors="replace"),
                             add_special_tokens=mode == "special").ids
            want = "%s %d %016x" % (os.path.basename(p), len(ids),
                                    fnv64(struct.pack("<%dI" % len(ids), *ids)))
            if line != want:
                differ += 1
                print("differs: %s: ours %s, tokenizers %s" % (mode, line, want))
        print("%s: %d of %d inputs give the ids of tokenizers" % (mode, len(files) - differ, len(files)))
        bad += differ
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
