#!/usr/bin/env python3
"""Writes the Hugging Face model directories under tests/checkpoint/hf/ that
test_hf_model.c reads, and for each a NAME.expected file of reference values computed
here, independently of the C reader. Run once, commit the outputs; no test runs this:

    /root/venv-peers/bin/python tests/checkpoint/make_hf_fixtures.py

(torch 2.13.0, transformers 5.24.0, safetensors 0.8.0: pinned in the .expected headers.)

  gpt2-f32               GPT2LMHeadModel.save_pretrained as is: "transformer." names, F32
  gpt2-hub-bf16-sharded  the hub's layout: no prefix, BF16, h.{i}.attn.bias buffers kept,
                         three files with model.safetensors.index.json
  gpt2-hub-50257         the same layout with GPT-2's own vocabulary of 50257 tokens (one
                         layer, 16 wide, to stay small); no .expected: examples/lm trains
                         and exports it (tests/examples/gpt2_check.sh)
  llama-f32, llama-bf16  LlamaForCausalLM (GQA 4/2 heads, untied head, llama3 rope
                         scaling), save_pretrained in F32 and in BF16
  llama-lora, gpt2-lora  peft's LoRA adapters (r 4, alpha 8, dropout 0.05; q_proj and
                         v_proj, and c_attn and c_proj) on llama-f32 and gpt2-f32, as
                         PeftModel.save_pretrained writes them, random B

GPT-2 has vocab 261 (odd, as GPT-2's 50257 is, and above 256 so the byte-level example
trains on it). Every parameter is random (biases and norms too), so a value read from the
wrong place shows.

NAME.expected: per tensor, in the canonical layout of include/fsdp2/hf_model.h (linear
weights [out, in]: Conv1D weights transposed): name rows cols sum wsum first last, where
wsum = sum_k v[k] * (k % 7 + 1) over the flat canonical index k (catches a permutation
that a plain sum would not). f64 of the values as stored.
"""
import json
import os
import shutil
import sys

import safetensors
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
import peft
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "hf")
VERSIONS = (f"torch {torch.__version__.split('+')[0]}, transformers {transformers.__version__}, "
            f"safetensors {safetensors.__version__}")
COMMAND = "/root/venv-peers/bin/python tests/checkpoint/make_hf_fixtures.py"
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def fresh(name):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def canonical(name):
    return name[len("transformer."):] if name.startswith("transformer.") else name


def stored_tensors(path):
    """Every tensor of a directory, as stored, by its stored name."""
    index = os.path.join(path, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values()))
             if os.path.exists(index) else ["model.safetensors"])
    out = {}
    for f in files:
        with safe_open(os.path.join(path, f), "pt") as st:
            for k in st.keys():
                out[k] = st.get_tensor(k)
    return out


def write_expected(name, arch):
    tensors = stored_tensors(os.path.join(OUT, name))
    lines = [f"# {name}: reference values by {COMMAND}", f"# ({VERSIONS})",
             "# name rows cols sum wsum first last (canonical layout, f64)"]
    for k in sorted(tensors):
        c = canonical(k) if arch == "gpt2" else k
        if c.endswith(".attn.bias") and c.startswith("h.") and tensors[k].dim() == 4:
            continue  # a buffer, not a parameter
        if arch == "gpt2" and c == "lm_head.weight":
            continue  # tied
        v = tensors[k].to(torch.float64)
        if arch == "gpt2" and c.endswith(CONV1D):
            v = v.t().contiguous()
        rows, cols = (v.shape[0], v.shape[1]) if v.dim() == 2 else (v.shape[0], 1)
        flat = v.reshape(-1)
        weights = (torch.arange(flat.numel(), dtype=torch.float64) % 7) + 1
        lines.append(f"{c} {rows} {cols} {flat.sum().item():.17g} "
                     f"{(flat * weights).sum().item():.17g} {flat[0].item():.17g} "
                     f"{flat[-1].item():.17g}")
    with open(os.path.join(OUT, name + ".expected"), "w") as f:
        f.write("\n".join(lines) + "\n")


def gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=261, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    randomize(model, 1)
    model.save_pretrained(fresh("gpt2-f32"))
    write_expected("gpt2-f32", "gpt2")

    hub_layout("gpt2-f32", "gpt2-hub-bf16-sharded", cfg.n_layer, cfg.n_positions)
    write_expected("gpt2-hub-bf16-sharded", "gpt2")

    # GPT-2's own vocabulary, through a full-size f32 directory removed afterwards
    torch.manual_seed(0)
    big = GPT2Config(vocab_size=50257, n_embd=16, n_layer=1, n_head=2, n_positions=32,
                     bos_token_id=50256, eos_token_id=50256)
    model = GPT2LMHeadModel(big)
    randomize(model, 3)
    model.save_pretrained(fresh("gpt2-50257-f32"))
    hub_layout("gpt2-50257-f32", "gpt2-hub-50257", big.n_layer, big.n_positions)
    shutil.rmtree(os.path.join(OUT, "gpt2-50257-f32"))


def hub_layout(source, name, n_layer, n_positions):
    """source's tensors in the hub's layout: unprefixed names, BF16, the causal-mask
    buffers, three shards with an index."""
    path = fresh(name)
    os.makedirs(path)
    src = stored_tensors(os.path.join(OUT, source))
    tensors = {canonical(k): v.to(torch.bfloat16).contiguous() for k, v in src.items()}
    mask = torch.tril(torch.ones(n_positions, n_positions)).view(1, 1, n_positions, n_positions)
    for i in range(n_layer):
        tensors[f"h.{i}.attn.bias"] = mask.clone()
    names = sorted(tensors)
    groups = [names[0::3], names[1::3], names[2::3]]
    weight_map, total = {}, 0
    meta = {"format": "pt", "generator": f"{COMMAND} ({VERSIONS})"}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({k: tensors[k] for k in group}, os.path.join(path, fname), metadata=meta)
        for k in group:
            weight_map[k] = fname
            total += tensors[k].numel() * tensors[k].element_size()
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total, "generator": meta["generator"]},
                   "weight_map": weight_map}, f, indent=2)
    config = json.load(open(os.path.join(OUT, source, "config.json")))
    config["dtype"] = "bfloat16"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=[2, 3],
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 32})
    model = LlamaForCausalLM(cfg)
    randomize(model, 2)
    model.save_pretrained(fresh("llama-f32"))
    write_expected("llama-f32", "llama")
    model.to(torch.bfloat16).save_pretrained(fresh("llama-bf16"))
    write_expected("llama-bf16", "llama")


def adapter(base, name, targets, seed):
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(OUT, base))
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05,
                                                      target_modules=targets))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in lora.named_parameters():
            if "lora_" in pname:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    path = fresh(name)
    lora.save_pretrained(path)
    os.remove(os.path.join(path, "README.md"))  # peft's model card template: nothing of ours
    config_path = os.path.join(path, "adapter_config.json")
    config = json.load(open(config_path))  # the base as a path in the repository
    config["base_model_name_or_path"] = "tests/checkpoint/hf/" + base
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    with safe_open(os.path.join(path, "adapter_model.safetensors"), "pt") as st:
        tensors = {k: st.get_tensor(k) for k in st.keys()}
    lines = [f"# {name}: reference values by {COMMAND}", f"# ({VERSIONS}, peft {peft.__version__})",
             "# name rows cols sum wsum first last (canonical names, f64)"]
    for k in sorted(tensors):
        c = canonical(k.removeprefix("base_model.model."))
        flat = tensors[k].to(torch.float64).reshape(-1)
        weights = (torch.arange(flat.numel(), dtype=torch.float64) % 7) + 1
        lines.append(f"{c} {tensors[k].shape[0]} {tensors[k].shape[1]} {flat.sum().item():.17g} "
                     f"{(flat * weights).sum().item():.17g} {flat[0].item():.17g} "
                     f"{flat[-1].item():.17g}")
    with open(os.path.join(OUT, name + ".expected"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    gpt2()
    llama()
    adapter("llama-f32", "llama-lora", ["q_proj", "v_proj"], 7)
    adapter("gpt2-f32", "gpt2-lora", ["c_attn", "c_proj"], 8)
    for name in sorted(os.listdir(OUT)):
        p = os.path.join(OUT, name)
        size = sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p)) \
            if os.path.isdir(p) else os.path.getsize(p)
        print(f"{name}: {size} bytes", file=sys.stderr)
