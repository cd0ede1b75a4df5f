"""What the CPU peers share: a process group over gloo from fsdp2run's environment, and
a way out that skips the interpreter's teardown (which can hang in gloo's threads once
the other ranks have exited, and the benchmark with it)."""
import os
import sys

import torch
import torch.distributed as dist


def start(threads):
    """(world size, rank) from fsdp2run's environment; threads > 0 sets torch's threads;
    a gloo group at several ranks; the seed 1."""
    ws, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if threads > 0:
        torch.set_num_threads(threads)
    if ws > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(1)
    return ws, rank


def finish(ws):
    """Every rank meets the others, then leaves (files the caller wrote are closed)."""
    if ws > 1:
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
