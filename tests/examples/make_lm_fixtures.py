#!/usr/bin/env python3
"""Writes lm_gpt2.safetensors and lm_llama.safetensors beside this file: a tiny random
GPT2LMHeadModel and LlamaForCausalLM (grouped-query attention, an untied head, Llama 3's
rope scaling) from transformers, their weights, a batch of tokens and targets, and what
transformers computes from them in float64: the logits, the mean cross-entropy and every
parameter's gradient. test_lm_model.c runs examples/lm's model on the same weights and
compares; the suite reads the files and never needs Python.

Run once by hand in a venv with torch and transformers (pip install torch==2.13.0
transformers safetensors):

    ~/venv-peers/bin/python tests/examples/make_lm_fixtures.py

Tensor names: "param:NAME" and "grad:NAME" with NAME the parameter's name in
examples/lm/model.h (GPT-2's without "transformer.", its Conv1D weights transposed to
[out, in] as the model keeps them), "ids" and "targets" (I32 [batch, seq]), "logits"
(F64 [batch, seq, vocab]), "loss" (F64 [1]). The metadata records the versions and the
config."""
import json
import os

import peft
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH, SEQ = 2, 8


def our_name(name):
    """peft's and transformers' names as examples/lm's: no "base_model.model.", no
    GPT-2 "transformer.", no adapter name, no "base_layer." of an adapted linear."""
    name = name.removeprefix("base_model.model.").removeprefix("transformer.")
    return name.replace(".default.", ".").replace(".base_layer.", ".")


def write(name, model, vocab, conv1d=()):
    torch.manual_seed(20261129)
    ids = torch.randint(0, vocab, (BATCH, SEQ))
    targets = torch.randint(0, vocab, (BATCH, SEQ))
    model = model.double()
    logits = model(ids).logits
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    out = {"ids": ids.int(), "targets": targets.int(), "logits": logits.detach(),
           "loss": loss.detach().reshape(1)}
    for pname, p in model.named_parameters():
        key = our_name(pname)
        w, g = p.detach(), p.grad
        if key.endswith(".weight") and key.rsplit(".", 2)[-2] in conv1d:
            w, g = w.t(), (g.t() if g is not None else None)
        out["param:" + key] = w.float().contiguous()  # f32 values: the model's own
        if g is not None:  # frozen under LoRA: no gradient
            out["grad:" + key] = g.contiguous()
    meta = {"generator": "tests/examples/make_lm_fixtures.py",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "config": json.dumps(model.config.to_diff_dict())}
    safetensors.torch.save_file(out, os.path.join(HERE, name), metadata=meta)


def round_to_f32(model):
    """Weights that are f32 values, so that the f32 C model sees the same numbers."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.float())
    return model


torch.manual_seed(1)
gpt2 = transformers.GPT2Config(vocab_size=61, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4,
                               initializer_range=0.1, attn_implementation="eager",
                               resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
write("lm_gpt2.safetensors", round_to_f32(transformers.GPT2LMHeadModel(gpt2)), 61,
      conv1d=("c_attn", "c_proj", "c_fc"))

torch.manual_seed(2)
llama = transformers.LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.1,
    attn_implementation="eager",
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 4})
write("lm_llama.safetensors", round_to_f32(transformers.LlamaForCausalLM(llama)), 64)


def with_lora(model, targets, seed):
    """peft's LoRA (r 4, alpha 8, no dropout) on targets, lora_B drawn at random (peft
    starts it at zero, which would hide the adapter's forward)."""
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                      target_modules=list(targets)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in lora.named_parameters():
            if "lora_B" in pname:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return lora


torch.manual_seed(1)
write("lm_gpt2_lora.safetensors",
      with_lora(round_to_f32(transformers.GPT2LMHeadModel(gpt2)), ["c_attn", "c_proj"], 5), 61,
      conv1d=("c_attn", "c_proj", "c_fc"))
torch.manual_seed(2)
write("lm_llama_lora.safetensors",
      with_lora(round_to_f32(transformers.LlamaForCausalLM(llama)), ["q_proj", "v_proj",
                                                                      "down_proj"], 6), 64)
