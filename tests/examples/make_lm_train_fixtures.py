#!/usr/bin/env python3
"""Writes the fixtures of lm_check.sh: two tiny random model directories as transformers
saves them (lm-init/llama: LlamaForCausalLM with 4 query heads over 2 key/value heads, an
untied head and Llama 3's rope scaling; lm-init/gpt2: GPT2LMHeadModel), and
lm_train_fixture.json: the losses of 20 AdamW steps that PyTorch autograd takes from them
on examples/lm's own batches of gpt2_corpus.txt (its --dump-batches file), with
examples/lm's recipe (AdamW betas 0.9/0.95, eps 1e-8, decay 0.1 on the matrices but the
embeddings, warmup then cosine, clipping at 1): in float64 (the reference), in float32,
and PyTorch's two bf16 recipes, whose distance from the reference is the spread bf16
brings: float32 under torch.autocast(cpu, bfloat16), and FSDP2's
MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), which computes the
whole step on a bf16 copy of the float32 parameters and reduces the gradients into
float32 (what examples/lm's --param-dtype bf16 asks of the library). And LoRA: peft's
adapters (lm-init/NAME-lora, r 4, alpha 8, random B) trained 20 steps on the frozen base
in float64 (the base's other parameters frozen, as get_peft_model does), and
merge_and_unload's model (lm-init/NAME-lora-merged.safetensors).

Run once by hand, after a build, in a venv with torch and transformers (pip install
torch==2.13.0 transformers):

    ~/venv-peers/bin/python tests/examples/make_lm_train_fixtures.py build/examples/lm

The suite reads the files and never needs Python."""
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import peft
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "gpt2_corpus.txt")
# examples/lm's flags of the run, shared with lm_check.sh
RECIPE = dict(steps=20, batch=8, seq=32, lr=1e-3, min_lr=1e-4, warmup=5, weight_decay=0.1,
              clip=1.0)
FLAGS = ["--data", CORPUS, "--steps", "20", "--batch", "8", "--seq-len", "32", "--warmup", "5",
         "--val-every", "0", "--log-every", "1"]


def configs():
    llama = transformers.LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        bos_token_id=None, eos_token_id=None)
    gpt2 = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2,
                                   n_head=4, bos_token_id=None, eos_token_id=None)
    return {"llama": (llama, transformers.LlamaForCausalLM),
            "gpt2": (gpt2, transformers.GPT2LMHeadModel)}


def lr_at(step):
    """examples/lm's schedule (fsdp2_lr_at's cosine) at t = step + 1."""
    r = RECIPE
    t, total = step + 1, max(r["steps"], r["warmup"])
    if t < r["warmup"]:
        return r["lr"] * t / r["warmup"]
    if t >= total:
        return r["min_lr"]
    cos = 0.5 * (1 + math.cos(math.pi * (t - r["warmup"]) / (total - r["warmup"])))
    return r["min_lr"] + (r["lr"] - r["min_lr"]) * cos


def read_batches(path):
    """{step: [batch, seq + 1] windows in index order} from the example's dump."""
    by_step = {}
    with open(path) as f:
        for line in f:
            v = [int(x) for x in line.split()]
            by_step.setdefault(v[0], []).append((v[1], v[2:]))
    return {s: torch.tensor([w for _, w in sorted(ws)]) for s, ws in by_step.items()}


LORA_TARGETS = {"llama": ["q_proj", "v_proj", "down_proj"], "gpt2": ["c_attn", "c_proj"]}


def make_adapter(directory, name, path):
    """peft's LoRA (r 4, alpha 8, no dropout: peft's masks are torch's) on the model, B
    drawn at random (peft starts it at zero), as PeftModel.save_pretrained writes it; and
    merge_and_unload's model beside it, for --export-merged."""
    base = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                     target_modules=LORA_TARGETS[name]))
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for pname, p in lora.named_parameters():
            if "lora_B" in pname:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    shutil.rmtree(path, ignore_errors=True)
    lora.save_pretrained(path)
    os.remove(os.path.join(path, "README.md"))  # peft's model card template: nothing of ours
    config = os.path.join(path, "adapter_config.json")
    c = json.load(open(config))
    c["base_model_name_or_path"] = f"tests/examples/lm-init/{name}"
    json.dump(c, open(config, "w"), indent=2, sort_keys=True)
    merged = lora.merge_and_unload().state_dict()
    tied = name == "gpt2"  # its head is wte: stored once, as the export stores it
    keep = {k.removeprefix("transformer."): v.clone().contiguous() for k, v in merged.items()
            if ".attn.bias" not in k and not (tied and k == "lm_head.weight")}
    safetensors.torch.save_file(keep, path + "-merged.safetensors")


def train(directory, batches, dtype, autocast=False, param_bf16=False, adapter=None):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager")
    if adapter:
        model = peft.PeftModel.from_pretrained(model, adapter, is_trainable=True)
    model = model.to(dtype)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and
             p.dim() == 2 and "wte" not in n and "wpe" not in n and "embed_tokens" not in n]
    ids = {id(p) for p in decay}
    rest = [p for p in model.parameters() if id(p) not in ids and p.requires_grad]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": RECIPE["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=RECIPE["lr"], betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for step in range(RECIPE["steps"]):
        w = batches[step]
        x, y = w[:, :-1], w[:, 1:]
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        run = copy.deepcopy(model).to(torch.bfloat16) if param_bf16 else model
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = run(x).logits
        loss = F.cross_entropy(logits.to(dtype).reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if param_bf16:  # the gradients reduced in float32 onto the float32 parameters
            for p, q in zip(model.parameters(), run.parameters()):
                p.grad = q.grad.to(dtype)
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                       RECIPE["clip"])
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    lm = sys.argv[1]
    out = {"generator": "tests/examples/make_lm_train_fixtures.py",
           "torch": torch.__version__, "transformers": transformers.__version__,
           "flags": FLAGS, "models": {}}
    work = tempfile.mkdtemp()
    for name, (config, cls) in configs().items():
        torch.manual_seed(3)
        directory = os.path.join(HERE, "lm-init", name)
        shutil.rmtree(directory, ignore_errors=True)
        cls(config).save_pretrained(directory)
        dump = os.path.join(work, name)
        subprocess.run([lm, "--model", directory, *FLAGS, "--steps", "20",
                        "--dump-batches", dump], check=True, stdout=subprocess.DEVNULL)
        batches = read_batches(dump + ".0")
        out["models"][name] = {
            "f64": train(directory, batches, torch.float64),
            "f32": train(directory, batches, torch.float32),
            "bf16_autocast": train(directory, batches, torch.float32, autocast=True),
            "bf16_params": train(directory, batches, torch.float32, param_bf16=True),
        }
        adapter = os.path.join(HERE, "lm-init", name + "-lora")
        make_adapter(directory, name, adapter)
        out["models"][name + "-lora"] = {
            "f64": train(directory, batches, torch.float64, adapter=adapter)}
        print(name, out["models"][name]["f64"][::5])
    shutil.rmtree(work)
    with open(os.path.join(HERE, "lm_train_fixture.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
