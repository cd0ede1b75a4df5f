"""The peer of bench/lora.sh: the same Llama-shaped model in Hugging Face transformers,
fine-tuned in full or through a PEFT LoRA adapter, as a user of transformers + peft runs
it on CPUs: plain at one rank, DistributedDataParallel over gloo at several (what
Accelerate sets up for CPU processes), launched by fsdp2run.

The model is the example's own export (examples/lm --steps 0 --export DIR), loaded with
AutoModelForCausalLM, so both sides train the same architecture and sizes. Batches are
random windows of bytes (the step's cost does not depend on the tokens), this rank's share
of the global batch; AdamW (betas 0.9, 0.95, weight decay 0.1 as the example's default),
gradient clipping at 1.0; the loss is the next-token cross entropy over the window.

    build/examples/lm --preset llama-small --steps 0 --export base
    build/tools/fsdp2run --nproc-per-node 2 ~/venv-peers/bin/python bench/peer_lora.py \\
        --model base --steps 6 --lora r=8,alpha=16,targets=q_proj,k_proj,v_proj,o_proj

Writes {"records": [{"step", "ms", "train_loss"}, ...], ...} to --json (rank 0)."""
import argparse, json, time

import torch
import torch.nn.functional as F
import transformers

import peer_common


def lora_config(spec):
    """r=8,alpha=16,dropout=0.05,targets=q_proj,v_proj, as examples/lm --lora reads it:
    alpha 8 and dropout 0 unless given (LoraConfig's defaults); targets take the rest."""
    import peft
    fields, targets = {"r": 8, "lora_alpha": 8, "lora_dropout": 0.0}, []
    parts = spec.split(",")
    for i, part in enumerate(parts):
        key, _, value = part.partition("=")
        if key == "targets":
            targets = [value] + parts[i + 1:]
            break
        fields[{"r": "r", "alpha": "lora_alpha", "dropout": "lora_dropout"}[key]] = \
            float(value) if key == "dropout" else int(value)
    return peft.LoraConfig(target_modules=targets, bias="none", **fields)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--lora", help="the adapter (without it: full fine-tuning)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=8, help="global batch, sequences")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args()
    ws, rank = peer_common.start(a.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    T, V = model.config.max_position_embeddings, model.config.vocab_size
    if a.lora:
        import peft
        model = peft.get_peft_model(model, lora_config(a.lora))
    model.train()
    net = torch.nn.parallel.DistributedDataParallel(model) if ws > 1 else model
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    g = torch.Generator().manual_seed(7 + rank)
    records = []
    for step in range(a.steps):
        w = torch.randint(0, V, (a.batch // ws, T + 1), generator=g)
        x, y = w[:, :-1], w[:, 1:]
        t0 = time.perf_counter()
        logits = net(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        records.append({"step": step + 1, "ms": 1000 * (time.perf_counter() - t0),
                        "train_loss": loss.item()})
    if rank == 0:
        trainable = sum(q.numel() for q in params)
        ms = [r["ms"] for r in records[1:]] or [records[0]["ms"]]
        print(f"torch {torch.__version__}, transformers {transformers.__version__}"
              f"{', peft ' + __import__('peft').__version__ if a.lora else ''}: ws {ws}, "
              f"{trainable} trainable parameters, {sum(ms) / len(ms):.1f} ms/step", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"ws": ws, "batch": a.batch, "threads": torch.get_num_threads(),
                           "lora": a.lora, "trainable": trainable, "records": records}, f)
    peer_common.finish(ws)


if __name__ == "__main__":
    main()
