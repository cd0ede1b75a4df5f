"""The peer of bench/fsdp_cuda_step.c: PyTorch's fully_shard (FSDP2) on one GPU, the same
model and step. L layers, each a weight [R, C] and a bias [R] (f32 parameters), one
fully_shard unit per layer and the root, MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=f32); the loss 0.5 * |w - t|^2 per parameter against a fixed f32 target,
as an autograd Function whose forward computes nothing and whose backward returns
(w - t) in w's dtype (the gradient the C side adds with two accumulates); AdamW
(lr 1e-3, weight decay 0.01, torch's default foreach path) and zero_grad; a
synchronize ends each step.

    python3 bench/peer_fsdp_cuda.py [--layers 8] [--rows 4096] [--cols 4095]
                                    [--steps 20] [--warmup 3] [--json FILE]

Prints the median, best and mean step time and the peak of torch's caching allocator
during the timed steps (max_memory_allocated) less the targets; --json writes them."""
import argparse, json, os, time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class ParamLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, t):
        ctx.save_for_backward(w, t)
        return w.new_zeros((), dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_out):
        w, t = ctx.saved_tensors
        return (w - t).to(w.dtype), None


class Layer(nn.Module):
    def __init__(self, rows, cols):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, cols).uniform_(-0.05, 0.05))
        self.bias = nn.Parameter(torch.empty(rows).uniform_(-0.05, 0.05))

    def forward(self, tw, tb):
        return ParamLoss.apply(self.weight, tw) + ParamLoss.apply(self.bias, tb)


class Model(nn.Module):
    def __init__(self, layers, rows, cols):
        super().__init__()
        self.layers = nn.ModuleList(Layer(rows, cols) for _ in range(layers))

    def forward(self, targets):
        loss = 0
        for layer, (tw, tb) in zip(self.layers, targets):
            loss = loss + layer(tw, tb)
        return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4095)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Model(a.layers, a.rows, a.cols)
        targets = [(torch.full((a.rows, a.cols), 0.25), torch.full((a.rows,), 0.25))
                   for _ in range(a.layers)]
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    target_bytes = sum(t.numel() * 4 for pair in targets for t in pair)
    params = sum(p.numel() for p in model.parameters())
    times = []
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = model(targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() - target_bytes
    times.sort()
    median, best, mean = times[len(times) // 2], times[0], sum(times) / len(times)
    print(f"torch {torch.__version__} fully_shard, {a.layers} layers of [{a.rows}, {a.cols}] + "
          f"[{a.rows}] ({params / 1e6:.1f} M parameters), bf16 params, f32 reduce, AdamW")
    print(f"{'':26} {'median ms':>12} {'best ms':>12} {'mean ms':>12} {'peak MiB':>14}")
    print(f"{'torch fully_shard':26} {median:12.3f} {best:12.3f} {mean:12.3f} "
          f"{peak / 1048576:14.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"impl": "torch", "version": torch.__version__, "layers": a.layers,
                       "rows": a.rows, "cols": a.cols, "params": params, "steps": a.steps,
                       "median_ms": median, "best_ms": best, "mean_ms": mean,
                       "peak_bytes": peak}, f)
            f.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
