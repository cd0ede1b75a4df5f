#!/usr/bin/env python3
"""Loads adapter directories examples/lm wrote (--save-adapter) in peft, and its merged
exports (--export-merged) in transformers, and checks them against peft: no missing or
unexpected keys when peft loads the adapter, the logits of base + adapter in peft equal to
the logits of our merged export within 1e-5, and peft's merge_and_unload() equal to our
merged weights within 1e-6. By hand: it needs torch, transformers and peft.

    build/examples/lm --model DIR --data FILE --lora r=8,targets=q_proj,v_proj --steps 10 \\
        --save-adapter ad --export-merged merged
    ~/venv-peers/bin/python bench/peft_check.py DIR ad merged
"""
import sys

import peft
import torch
import transformers


def main(base_dir, adapter_dir, merged_dir):
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, adapter_dir)
    state = peft.get_peft_model_state_dict(model)
    loaded = peft.utils.save_and_load.load_peft_weights(adapter_dir)
    missing = sorted(set(state) - set(loaded))
    unexpected = sorted(set(loaded) - set(state))
    ours = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs_logits = model(ids).logits
        ours_logits = ours(ids).logits
        merged = model.merge_and_unload().state_dict()
    ours_state = ours.state_dict()
    weights = max((merged[k] - ours_state[k]).abs().max().item() for k in merged)
    logits = (theirs_logits - ours_logits).abs().max().item()
    print(f"peft {peft.__version__}: {adapter_dir}: missing keys {missing}, unexpected {unexpected}; "
          f"logits within {logits:.2e}, merged weights within {weights:.2e}")
    return 0 if not missing and not unexpected and logits <= 1e-5 and weights <= 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
