#!/usr/bin/env python3
"""Loads directories the library exported (bench/hf_export_check.sh) in transformers and
checks them against the directories they came from: no missing or unexpected keys, every
parameter equal (f32 exports) or the source rounded to bf16 (bf16 exports), the same
logits on a few tokens.

    hf_export_check.py SOURCE EXPORT [SOURCE EXPORT ...] [--loss DIR BATCHES JSON]

--loss: the GPT-2 example's first training loss from DIR (--init-from, --dump-batches
BATCHES, --json JSON) against transformers' loss of DIR's model on the same batch.
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


def check_loss(source, batches, record):
    model, _ = load(source)
    rows = sorted((int(v[1]), [int(x) for x in v[2:]])
                  for v in (line.split() for line in open(batches)) if int(v[0]) == 0)
    w = torch.tensor([r for _, r in rows])
    with torch.no_grad():
        logits = model(w[:, :-1]).logits
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             w[:, 1:].reshape(-1)).item()
    got = json.load(open(record))["records"][0]["train_loss"]
    rel = abs(got - want) / abs(want)
    print(f"{source}: the example's step-1 loss {got:.7f}, transformers {want:.7f} "
          f"(relative {rel:.1e}): {'ok' if rel < 1e-5 else 'FAIL'}")
    return rel < 1e-5


if __name__ == "__main__":
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    args, loss = sys.argv[1:], None
    if "--loss" in args:
        at = args.index("--loss")
        loss, args = args[at + 1:at + 4], args[:at]
    pairs = list(zip(args[0::2], args[1::2]))
    ok = all([check(s, e) for s, e in pairs])
    if loss:
        ok = check_loss(*loss) and ok
    sys.exit(0 if ok else 1)
