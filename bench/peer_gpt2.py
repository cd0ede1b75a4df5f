"""The peer of examples/lm: the same GPT-2 in PyTorch (Debian's python3-torch, CPU),
loading the example's initial weights from its Hugging Face export (read here with a
reader written from the safetensors spec) and consuming the same token windows (the
example's --dump-batches file), with the same AdamW (decay on the blocks' matrices),
cosine schedule and clipping.

Check (one process): the training losses of the first steps, to compare with the
example's --json log:

    build/examples/lm --preset tiny --steps 0 --export init.safetensors
    build/examples/lm --preset tiny --steps 20 --log-every 1 --json ours.json \
        --dump-batches batches
    /usr/bin/python3 bench/peer_gpt2.py --init init.safetensors --batches batches.0 \
        --steps 20 --json theirs.json

Bench (under fsdp2run: plain at one rank, DDP over gloo at several): ms per step and
tokens/s on random weights and the same kind of batches (--bench, no --init)."""
import argparse, json, math, struct, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import peer_common

PRESETS = {"tiny": (4, 4, 128, 128, 256), "small": (6, 6, 384, 256, 256),
           "gpt2-124m": (12, 12, 768, 1024, 50304)}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data, dtype="<f4", count=(e - b) // 4,
                                  offset=8 + n + b).reshape(t["shape"]).copy()
    return out


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        hd = C // self.H
        q, k, v = (t.view(B, T, self.H, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, H, C, T, V):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()  # the head tied to wte

    def load_hf(self, w):
        """Hugging Face names; Conv1D weights [in, out] transposed to Linear's [out, in]."""
        g = lambda n: torch.from_numpy(w["transformer." + n])
        with torch.no_grad():
            self.wte.weight.copy_(g("wte.weight"))
            self.wpe.weight.copy_(g("wpe.weight"))
            self.ln_f.weight.copy_(g("ln_f.weight"))
            self.ln_f.bias.copy_(g("ln_f.bias"))
            for i, b in enumerate(self.h):
                p = f"h.{i}."
                for mine, theirs in [(b.ln_1, "ln_1"), (b.ln_2, "ln_2")]:
                    mine.weight.copy_(g(p + theirs + ".weight"))
                    mine.bias.copy_(g(p + theirs + ".bias"))
                for mine, theirs in [(b.c_attn, "attn.c_attn"), (b.c_proj, "attn.c_proj"),
                                     (b.c_fc, "mlp.c_fc"), (b.mlp_proj, "mlp.c_proj")]:
                    mine.weight.copy_(g(p + theirs + ".weight").t())
                    mine.bias.copy_(g(p + theirs + ".bias"))

    def param_groups(self, weight_decay):
        decay = [m.weight for b in self.h for m in (b.c_attn, b.c_proj, b.c_fc, b.mlp_proj)]
        ids = {id(p) for p in decay}
        rest = [p for p in self.parameters() if id(p) not in ids]
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": rest, "weight_decay": 0.0}]


def lr_at(a, step):
    """fsdp2_lr_at's cosine schedule at t = step + 1 (what the example sets)."""
    t, total = step + 1, max(a.steps, a.warmup)
    if t < a.warmup:
        return a.lr * t / a.warmup
    if t >= total:
        return a.min_lr
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * (t - a.warmup) / (total - a.warmup)))


def read_batches(path):
    """{step: [B, T + 1] windows in index order} from the example's dump."""
    by_step = {}
    with open(path) as f:
        for line in f:
            v = [int(x) for x in line.split()]
            by_step.setdefault(v[0], []).append((v[1], v[2:]))
    return {s: torch.tensor([w for _, w in sorted(ws)]) for s, ws in by_step.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--init"), p.add_argument("--batches"), p.add_argument("--json")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--dtype", default="f32", choices=["f32", "f64"])
    p.add_argument("--bench", action="store_true")
    p.add_argument("--autocast-bf16", action="store_true",
                   help="forward under torch.autocast(cpu, bfloat16): PyTorch's own bf16 run")
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    L, H, C, T, V = PRESETS[a.preset]
    ws, rank = peer_common.start(a.threads)
    model = GPT2(L, H, C, T, V)
    if a.init:
        model.load_hf(read_safetensors(a.init))
    if a.dtype == "f64":
        model = model.double()
    net = nn.parallel.DistributedDataParallel(model) if ws > 1 else model
    opt = torch.optim.AdamW(model.param_groups(a.weight_decay), lr=a.lr, betas=(0.9, 0.95),
                            eps=1e-8)
    batches = read_batches(a.batches) if a.batches else None
    g = torch.Generator().manual_seed(7)
    records, t0 = [], None
    for step in range(a.steps):
        if batches is not None:
            w = batches[step]
        else:  # bench: random windows of bytes, this rank's share of the global batch
            w = torch.randint(0, 256, (a.batch // ws, T + 1), generator=g)
        x, y = w[:, :-1], w[:, 1:]
        for group in opt.param_groups:
            group["lr"] = lr_at(a, step)
        if step == 1:
            t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast_bf16):
            logits = net(x)
        loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        records.append({"step": step + 1, "train_loss": loss.item(), "grad_norm": float(norm)})
        if rank == 0 and not a.bench:
            print(f"step {step + 1:4d} | loss {loss.item():.6f} | norm {float(norm):.4f}")
    secs = time.perf_counter() - t0 if t0 else 0.0
    ms = 1000 * secs / max(a.steps - 1, 1)
    out = {"preset": a.preset, "ws": ws, "batch": a.batch, "threads": torch.get_num_threads(),
           "ms_per_step": ms, "tokens_per_s": a.batch * T / (ms / 1000) if ms else 0,
           "records": records}
    if rank == 0:
        if a.bench:
            print(f"torch {torch.__version__}: {a.preset} ws {ws} batch {a.batch}: {ms:.1f} ms/step, "
                  f"{out['tokens_per_s']:.0f} tokens/s ({torch.get_num_threads()} threads/rank)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f)
    peer_common.finish(ws)


if __name__ == "__main__":
    main()
