"""The digits CNN of train_digits.py under torch.distributed DistributedDataParallel (gloo),
with flux_dnn's convolutions.

    python examples/ddp_train.py --world-size 2              # spawns 2 processes
    torchrun --nproc-per-node 2 examples/ddp_train.py        # or let torchrun start them
    python examples/ddp_train.py --world-size 1              # the single-process reference

Every step takes the same global batch in every configuration; each of the W processes takes
its 1/W share, and DDP averages the gradients, so W processes compute the same updates as one
process on the whole batch (up to float32 rounding). --out saves the final state_dict.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_digits, when run by torchrun

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from train_digits import accuracy, batches, load_digits_split, make_model  # noqa: E402


def global_batches(n: int, batch_size: int, steps: int, seed: int):
    """The first `steps` full global batches of the epoch-by-epoch shuffled order (the last,
    partial batch of an epoch is dropped, so every process always gets an equal share)."""
    out, epoch = [], 0
    while len(out) < steps:
        out += [b for b in batches(n, batch_size, epoch, seed) if len(b) == batch_size]
        epoch += 1
    return out[:steps]


def train(rank: int, world: int, args) -> nn.Module:
    x, y, x_te, y_te = load_digits_split(args.seed)
    model = make_model(use_flux=not args.torch, seed=args.seed)
    net = DDP(model) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    share = args.batch_size // world
    for step, idx in enumerate(global_batches(len(x), args.batch_size, args.steps, args.seed)):
        mine = idx[rank * share : (rank + 1) * share]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x[mine]), y[mine])
        loss.backward()  # DDP all-reduces (averages) the gradients across processes here
        opt.step()
        if rank == 0 and (step + 1) % args.log_every == 0:
            print(f"step {step + 1:4d}  loss (rank 0 share) {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"world size {world}: test accuracy {accuracy(model, x_te, y_te) * 100:.2f}%", flush=True)
        if args.out:
            torch.save(model.state_dict(), args.out)
    return model


def worker(rank: int, world: int, port: int, args) -> None:
    """One process of the group (mp.spawn calls it with the rank first)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        train(rank, world, args)
        # Every rank done with its collectives before any tears gloo down: a rank that exits
        # first closes its pairs under a peer still shutting down (one SIGABRT in CI at exit,
        # "terminate called without an active exception", under heavy load).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=2, help="processes to spawn (ignored under torchrun)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (global batches)")
    p.add_argument("--batch-size", type=int, default=64, help="global batch, split evenly over the processes")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch", action="store_true", help="use torch.nn.Conv2d instead of flux_dnn")
    p.add_argument("--out", help="save rank 0's final state_dict here")
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        world = int(os.environ["WORLD_SIZE"])
        if args.batch_size % world:
            p.error(f"--batch-size {args.batch_size} must be divisible by the world size {world}")
        worker(int(os.environ["RANK"]), world, 0, args)
        return
    world = args.world_size
    if args.batch_size % world:
        p.error(f"--batch-size {args.batch_size} must be divisible by --world-size {world}")
    if world == 1:
        train(0, 1, args)
        return
    # Share the CPU between the processes instead of each one taking every core.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    mp.spawn(worker, args=(world, free_port(), args), nprocs=world, join=True)


if __name__ == "__main__":
    main()
