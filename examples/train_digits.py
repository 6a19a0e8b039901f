"""Train a small CNN on scikit-learn's digits (8x8 images, no download) with flux_dnn's
convolutions, and print the test accuracy.

    python examples/train_digits.py            # flux_dnn.torch.Conv2d
    python examples/train_digits.py --torch    # the same model on torch.nn.Conv2d
    python examples/train_digits.py --quick    # 3 epochs, a smoke run

The model is plain PyTorch; flux_dnn.torch.convert() switches its convolutions to flux_dnn,
keeping the weights, so both variants start from identical parameters for a given seed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

import flux_dnn.torch as ft


def load_digits_split(seed: int = 0, test_fraction: float = 0.2):
    """(x_train, y_train, x_test, y_test): images (N, 1, 8, 8) float32 in [0, 1], a stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, digits.target, test_size=test_fraction, random_state=seed, stratify=digits.target
    )
    as_t = torch.from_numpy
    return as_t(x_tr), as_t(y_tr).long(), as_t(x_te), as_t(y_te).long()


def make_model(use_flux: bool = True, seed: int = 0) -> nn.Module:
    """conv(1->16) ReLU pool, conv(16->32) ReLU pool, linear head: 8x8 -> 4x4 -> 2x2 -> 10."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 2 * 2, 10),
    )
    return ft.convert(model) if use_flux else model


def batches(n: int, batch_size: int, epoch: int, seed: int):
    """The same shuffled order for a given (seed, epoch) in every process."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return [torch.from_numpy(order[i : i + batch_size]) for i in range(0, n, batch_size)]


def accuracy(model: nn.Module, x, y) -> float:
    with torch.inference_mode():
        return (model(x).argmax(1) == y).float().mean().item()


def train(model, x, y, epochs: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 0, log=print):
    """Adam on cross-entropy with a cosine learning-rate decay (steadier final accuracy across
    seeds); returns the mean training loss of every epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps = epochs * len(batches(len(x), batch_size, 0, seed))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1))
    loss_fn = nn.CrossEntropyLoss()
    history = []
    for epoch in range(epochs):
        total, count = 0.0, 0
        for idx in batches(len(x), batch_size, epoch, seed):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            schedule.step()
            total += loss.item() * len(idx)
            count += len(idx)
        history.append(total / count)
        if log:
            log(f"epoch {epoch + 1:3d}  loss {history[-1]:.4f}")
    return history


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--torch", action="store_true", help="use torch.nn.Conv2d instead of flux_dnn")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="3 epochs (a smoke run)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    epochs = 3 if args.quick else args.epochs

    x_tr, y_tr, x_te, y_te = load_digits_split(args.seed)
    model = make_model(use_flux=not args.torch, seed=args.seed)
    backend = "torch.nn.Conv2d" if args.torch else "flux_dnn.torch.Conv2d"
    print(f"{backend}: {len(x_tr)} training / {len(x_te)} test images, {epochs} epochs")
    start = time.perf_counter()
    history = train(model, x_tr, y_tr, epochs, args.batch_size, args.lr, args.seed)
    seconds = time.perf_counter() - start
    acc = accuracy(model, x_te, y_te)
    print(f"test accuracy {acc * 100:.2f}%  ({seconds:.1f} s training)")
    return {"accuracy": acc, "history": history, "seconds": seconds}


if __name__ == "__main__":
    main()
