#!/usr/bin/env python3
"""Trains two small byte-level BPE tokenizers on the fortunes corpus with Hugging Face
`tokenizers` and writes what the C tests compare against. Run once by hand, from the
repository root; the test suite reads the committed files and never needs Python:

    /root/venv-tok/bin/python tests/text/make_fixtures.py tests/text

Writes gpt2/tokenizer.json (GPT-2's layout: ByteLevel pre-tokenizer with its own regex,
merges as "a b" strings, <|endoftext|> appended after the vocabulary), llama3/tokenizer.json
(Llama 3's layout: Sequence[Split(Llama 3's regex, Isolated), ByteLevel(use_regex=false)],
ignore_merges, merges as [a, b] pairs, special tokens appended, TemplateProcessing adding
<|begin_of_text|>), and fixtures.txt:

    corpus TOKENIZER FILE BYTES TEXT_FNV COUNT IDS_FNV   (each fortunes file, encoded whole)
    case TOKENIZER MODE INPUT_HEX COUNT ID...            (the hostile texts)

TOKENIZER gpt2_prefix is gpt2 with its ByteLevel pre-tokenizer's add_prefix_space set.

MODE is 'plain' (no template, special tokens in the text are tokens), 'special' (the
template applied: add_special_tokens=True) or 'text' (special tokens in the text are
plain text: encode_special_tokens=True). Inputs that are not valid UTF-8 are decoded with
errors="replace" first, as the library does. FNV is FNV-1a 64 over the file's bytes, and
over the ids as little-endian uint32."""
import glob
import json
import os
import struct
import sys

import tokenizers
from tokenizers import (Regex, Tokenizer, decoders, models, pre_tokenizers, processors,
                        trainers)

CORPUS = "/usr/share/games/fortunes"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eot_id|>"]


def fnv64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def corpus_files():
    out = []
    for p in sorted(glob.glob(CORPUS + "/*")):
        if p.endswith(".dat") or os.path.islink(p) or not os.path.isfile(p):
            continue
        out.append(p)
    return out


def entries():
    for p in corpus_files():
        text = open(p, "rb").read().decode("utf-8", errors="replace")
        for e in text.split("\n%\n"):
            if e.strip():
                yield e


def train(pre, vocab_size, ignore_merges):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(entries(), trainer)
    return tok


def make_gpt2():
    tok = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), 3000, False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>"])
    j = json.loads(tok.to_str())
    # GPT-2's own file writes merges as "a b" strings (the older format)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    # and holds <|endoftext|> in the model's vocabulary too, as a normalized added token
    j["model"]["vocab"]["<|endoftext|>"] = j["added_tokens"][0]["id"]
    j["added_tokens"][0]["normalized"] = True
    return j


def make_llama3():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = train(pre, 4000, True)
    tok.add_special_tokens(LLAMA3_SPECIALS)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    return j


def hostile_texts():
    t = [b"", b"a", b" ", b"hello world", b"Hello, World! How's it going?",
         b"I'M YOU'RE HE'LL WE'VE SHE'D IT'S don'T Can'T o'S",
         b"'s 're 've 'm 'll 'd ''s", b"tab\there\ttwice\t\tend\t",
         b"line\nbreak\r\ncrlf\r\n\r\n\n\n  \n indented\n", b"trailing spaces   ",
         b"   leading", b" " * 1000, b"a" * 3000, b"ab" * 1500, b"\n" * 300, b"\t \t " * 100,
         b"0123456789 12345678901234567890 3.14159 1,000,000 -42 1e10 0x1F",
         b"9" * 1000, "数据并行训练，完全分片。日本語のテキスト".encode(),
         "مرحبا بالعالم العربية".encode(), "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 flags".encode(),
         "e\u0301 n\u0303 a\u0308\u0308\u0308 combining".encode(),
         "Ελληνικά Русский עברית हिन्दी ไทย".encode(),
         "nbsp\u00a0here ideographic\u3000space line\u2028sep nel\u0085x zwsp\u200bz".encode(),
         "\ufeffbom at start".encode(), "mixed数据and英文with123数字".encode(),
         b"<|endoftext|>", b"before<|endoftext|>after", b"word <|endoftext|> word",
         b"<|endoftext|><|endoftext|>", b"<|endoftext|", b"<|begin_of_text|>Hello",
         b"x<|end_of_text|>y <|eot_id|>\n<|start_header_id|>user<|end_header_id|>",
         b"<|reserved_special_token_0|><|reserved_special_token_1|>",
         b"<<|endoftext|>>", b"punctuation!!! ??? ... --- ((())) {}[] @#$%^&*",
         b"code: if (x == 1) { return y; } // comment\n\tfor i in range(10):\n",
         b"https://example.com/path?query=1&b=2 user@example.org",
         # invalid UTF-8: lone continuation, truncated sequences, overlongs, surrogates,
         # out of range, stray bytes inside words
         b"\x80", b"\xff\xfe", b"abc\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(",
         b"\xf0\x9f\x98", b"\xf0\x9f\x98x", b"\xc0\xaf", b"\xe0\x80\xaf",
         b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80",
         b"mid\xa0word and \xe9t\xe9 latin-1", b"\xc3\xa9\xc3",
         b"\x00nul\x00 bytes\x01\x02\x7f",
         # where the regex engines' idea of \s could differ (U+0085 is White_Space in
         # Unicode but not in \p{Z}; U+180E and U+200B are not White_Space)
         "!\u0085 and \u0085! x\u0085\u0085!".encode(), "?\u2028! \u2029\u2029!".encode(),
         "a\u180e!\u180e b \u200b! \u00a0!\u00a0\u00a0x".encode(),
         "\u1680!\u3000?\u202f.\u205f,".encode()]
    return t


def hostile_cases(lines, name, tok):
    for data in hostile_texts():
        s = data.decode("utf-8", errors="replace")
        for mode in ("plain", "special", "text"):
            tok.encode_special_tokens = mode == "text"
            ids = tok.encode(s, add_special_tokens=mode == "special").ids
            lines.append("case %s %s %s %d %s" % (name, mode, data.hex() or "-", len(ids),
                                                   " ".join(map(str, ids))))
    tok.encode_special_tokens = False


def main():
    outdir = sys.argv[1]
    toks = {"gpt2": make_gpt2(), "llama3": make_llama3()}
    # the GPT-2 file with add_prefix_space set (the test makes the same edit in memory)
    prefixed = json.loads(json.dumps(toks["gpt2"]))
    prefixed["pre_tokenizer"]["add_prefix_space"] = True
    lines = ["# generated by: /root/venv-tok/bin/python tests/text/make_fixtures.py tests/text"
             " (tokenizers %s, Python %s); corpus %s/* less .dat and links"
             % (tokenizers.__version__, sys.version.split()[0], CORPUS)]
    for name, j in toks.items():
        os.makedirs(os.path.join(outdir, name), exist_ok=True)
        text = json.dumps(j, ensure_ascii=False, indent=1)
        with open(os.path.join(outdir, name, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)
        # the expected ids come from the file as written, loaded back
        tok = Tokenizer.from_file(os.path.join(outdir, name, "tokenizer.json"))
        for p in corpus_files():
            data = open(p, "rb").read()
            ids = tok.encode(data.decode("utf-8", errors="replace"),
                             add_special_tokens=False).ids
            lines.append("corpus %s %s %d %016x %d %016x" % (
                name, os.path.basename(p), len(data), fnv64(data), len(ids),
                fnv64(struct.pack("<%dI" % len(ids), *ids))))
        hostile_cases(lines, name, tok)
    hostile_cases(lines, "gpt2_prefix", Tokenizer.from_str(json.dumps(prefixed)))
    with open(os.path.join(outdir, "fixtures.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
