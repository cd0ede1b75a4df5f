"""The peer of bench/lora.sh: the same Llama-shaped model in Hugging Face transformers,
fine-tuned in full or through a PEFT LoRA adapter, as a user of transformers + peft runs
it on CPUs: plain at one rank, DistributedDataParallel over gloo at several (what
Accelerate sets up for CPU processes), launched by fsdp2run.

The model is the example's own export (examples/lm --steps 0 --export DIR), loaded with
AutoModelForCausalLM, so both sides train the same architecture and sizes. Batches are
random windows of bytes (the step's cost does not depend on the tokens), this rank's share
of the global batch; AdamW as the example's (betas 0.9, 0.95; weight decay 0.1 on the
trained matrices but the embeddings), gradient clipping at 1.0; the loss is the next-token
cross entropy over the window.

    build/examples/lm --preset llama-small --steps 0 --export base
    build/tools/fsdp2run --nproc-per-node 2 ~/venv-peers/bin/python bench/peer_lora.py \\
        --model base --steps 6 --lora r=8,alpha=16,targets=q_proj,k_proj,v_proj,o_proj

Writes {"records": [{"step", "ms", "train_loss"}, ...], ...} to --json (rank 0)."""
import argparse, json, math, sys, time

import torch
import torch.nn.functional as F
import transformers

import peer_common


def lora_config(spec):
    """r=8,alpha=16,dropout=0.05,targets=q_proj,v_proj, read as examples/lm --lora reads
    it: r required (>= 1), alpha 8 and dropout 0 unless given (LoraConfig's defaults), and
    targets the names after targets= up to the next field. Anything else exits naming it."""
    import peft
    r, alpha, dropout, targets, in_targets = 0, 8.0, 0.0, [], False
    for part in spec.split(","):
        key, eq, value = part.partition("=")
        if not eq and in_targets:
            targets.append(part)
            continue
        in_targets = False
        try:
            if eq and key == "r":
                r = int(value)
            elif eq and key == "alpha":
                alpha = float(value)
            elif eq and key == "dropout":
                dropout = float(value)
            elif eq and key == "targets" and value:
                targets, in_targets = [value], True
            else:
                raise ValueError
        except ValueError:
            sys.exit(f"--lora {spec}: '{part}' is not r=N, alpha=X, dropout=X or targets=NAME,NAME")
    if r < 1 or not targets or not math.isfinite(alpha) or not 0 <= dropout < 1:
        sys.exit(f"--lora {spec}: needs r >= 1 and targets, a finite alpha and a dropout in [0, 1)")
    return peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                           bias="none")


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
    if a.batch % ws:
        sys.exit(f"--batch {a.batch} does not divide among {ws} ranks")
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    T, V = model.config.max_position_embeddings, model.config.vocab_size
    if a.lora:
        import peft
        model = peft.get_peft_model(model, lora_config(a.lora))
    model.train()
    net = torch.nn.parallel.DistributedDataParallel(model) if ws > 1 else model
    params = [q for q in model.parameters() if q.requires_grad]
    # as the example: decay 0.1 on the trained matrices but the embeddings, none elsewhere
    decay = [q for n, q in model.named_parameters()
             if q.requires_grad and q.dim() == 2 and "embed_tokens" not in n]
    ids = {id(q) for q in decay}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": [q for q in params if id(q) not in ids],
                              "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
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
