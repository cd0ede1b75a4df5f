#!/usr/bin/env python3
"""Loads directories the library exported (bench/hf_export_check.sh) in transformers and
checks them against the directories they came from: no missing or unexpected keys, every
parameter equal (f32 exports) or the source rounded to bf16 (bf16 exports), the same
logits on a few tokens.

    hf_export_check.py SOURCE EXPORT [SOURCE EXPORT ...]
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def load(path):
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                       dtype=torch.float32)
    return model.eval(), info


def check(source, export):
    a, _ = load(source)
    b, info = load(export)
    bad = [f"{k}: {info[k]}" for k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                       "error_msgs") if info.get(k)]
    config = json.load(open(os.path.join(export, "config.json")))
    bf16 = config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    sa, sb = a.state_dict(), b.state_dict()
    if sorted(sa) != sorted(sb):
        bad.append(f"state dict keys differ: {sorted(set(sa) ^ set(sb))}")
    for k in sa:
        want = sa[k].to(torch.bfloat16).to(torch.float32) if bf16 else sa[k]
        if k in sb and not torch.equal(sb[k], want):
            bad.append(f"{k}: max difference {(sb[k] - want).abs().max().item()}")
    tokens = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        la, lb = a(tokens).logits, b(tokens).logits
    diff = (la - lb).abs().max().item()
    if not bf16 and diff != 0:
        bad.append(f"logits differ by {diff}")
    status = "FAIL " + "; ".join(bad) if bad else "ok"
    print(f"{export}: {type(b).__name__}, {len(sb)} tensors, "
          f"{'bf16' if bf16 else 'f32'}, missing 0 unexpected 0, "
          f"max logit difference {diff:.3g}: {status}")
    return not bad


if __name__ == "__main__":
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    pairs = list(zip(sys.argv[1::2], sys.argv[2::2]))
    sys.exit(0 if all([check(s, e) for s, e in pairs]) else 1)
