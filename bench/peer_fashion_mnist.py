"""The peer of examples/fashion_mnist: the same recipe in PyTorch (Debian's python3-torch),
for bench/demo to run in the same session: the MLP (784-512-256-10, ReLU, log-softmax,
NLL) or the tutorial CNN, Adadelta lr 1.0, StepLR gamma 0.7 per epoch, global batch 64
split over the ranks by a DistributedSampler, test batch 1000, data normalised with
mean 0.2860 / std 0.3530, DDP over gloo when there is more than one rank.

    build/tools/fsdp2run --nproc-per-node N /usr/bin/python3 bench/peer_fashion_mnist.py \
        [--model mlp|cnn] [--epochs 2] [--json FILE]

(fsdp2run sets the torchrun variables; Debian's torch.distributed.run 1.13 fails under
Python 3.11.)

Prints one line per epoch (rank 0): train loss, test loss, accuracy, seconds (training
only, the mean over the ranks) and images/s; --json writes them."""
import argparse, gzip, json, os, struct, time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import peer_common


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(root, prefix):
    def find(name):
        p = os.path.join(root, name)
        return p + ".gz" if os.path.exists(p + ".gz") else p
    x = read_idx(find(f"{prefix}-images-idx3-ubyte")).astype(np.float32) / 255.0
    y = read_idx(find(f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    x = (x - 0.2860) / 0.3530
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 512), nn.Linear(512, 256), nn.Linear(256, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return F.log_softmax(self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))), dim=1)


class CNN(nn.Module):  # PyTorch's FSDP MNIST tutorial network
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = self.dropout2(F.relu(self.fc1(torch.flatten(self.dropout1(x), 1))))
        return F.log_softmax(self.fc2(x), dim=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--json")
    a = ap.parse_args()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    ws, rank = peer_common.start(max(1, (os.cpu_count() or 1) // local))
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "t10k")
    model = MLP() if a.model == "mlp" else CNN()
    if ws > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    train = torch.utils.data.TensorDataset(xtr, ytr)
    sampler = torch.utils.data.distributed.DistributedSampler(train, ws, rank, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(train, batch_size=64 // ws, sampler=sampler, drop_last=True)
    epochs = []
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t0, loss_sum, steps = time.perf_counter(), 0.0, 0
        for x, y in loader:
            opt.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            opt.step()
            loss_sum, steps = loss_sum + loss.item(), steps + 1
        seconds = time.perf_counter() - t0
        sched.step()
        model.eval()
        with torch.no_grad():  # every rank tests all of it: the same numbers on each
            out = torch.cat([model(xte[i:i + 1000]) for i in range(0, len(xte), 1000)])
            test_loss = F.nll_loss(out, yte, reduction="sum").item() / len(xte)
            acc = 100.0 * (out.argmax(1) == yte).sum().item() / len(xte)
        stats = torch.tensor([seconds, loss_sum, steps], dtype=torch.float64)
        if ws > 1:
            dist.all_reduce(stats)
        seconds = stats[0].item() / ws
        e = {"epoch": epoch + 1, "train_loss": stats[1].item() / stats[2].item(), "test_loss": test_loss,
             "accuracy": acc, "seconds": seconds, "images_per_s": steps * 64 / seconds}
        epochs.append(e)
        if rank == 0:
            print(f"peer epoch {e['epoch']}: train loss {e['train_loss']:.4f} | test loss {test_loss:.4f}, "
                  f"accuracy {acc:.2f}% | {seconds:.1f} s, {e['images_per_s']:.0f} images/s", flush=True)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "ws": ws, "epochs": epochs}, f)
    peer_common.finish(ws)


if __name__ == "__main__":
    main()
