"""Training-step benchmark: flux_dnn.torch convolutions vs torch's own, in the same run.

One step = forward, cross-entropy, backward, SGD update. Models: the digits CNN of
examples/train_digits.py (8x8 inputs) and a ResNet-18-sized network (ResNet-18's 20
convolutions with batch norm and residuals; input size --size). Each configuration builds two
models with identical weights, one converted with flux_dnn.torch.convert, and times them in
alternating rounds so that load on the machine hits both alike; it reports the median step time
of each and the ratio of steps per second (flux / torch; > 1 means flux_dnn is faster).

    python benchmarks/bench_training.py                 # fp32 and bf16 autocast, batch 16
    python benchmarks/bench_training.py --size 224 --rounds 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

import flux_dnn.torch as ft


def digits_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 2 * 2, 10),
    )


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def resnet18_like(classes: int = 10) -> nn.Module:
    """ResNet-18's layout: 7x7/2 stem, max pool, 4 stages of 2 basic blocks (64-512 channels)."""
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def make_step(model: nn.Module, x, y, bf16: bool):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step


def time_steps(step, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - start) / n


def bench(
    name: str,
    build,
    in_shape,
    batch: int,
    bf16: bool,
    rounds: int,
    steps: int,
    warmup: int,
    channels_last: bool = False,
) -> dict:
    torch.manual_seed(0)
    ref = build()
    x = torch.randn(batch, *in_shape)
    if channels_last:
        ref = ref.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    mine = ft.convert(copy.deepcopy(ref))
    y = torch.randint(0, 10, (batch,))
    steps_fn = {"flux": make_step(mine, x, y, bf16), "torch": make_step(ref, x, y, bf16)}
    for fn in steps_fn.values():
        time_steps(fn, warmup)
    times = {k: [] for k in steps_fn}
    for r in range(rounds):
        order = ("flux", "torch") if r % 2 == 0 else ("torch", "flux")
        for k in order:
            times[k].append(time_steps(steps_fn[k], steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "model": name,
        "dtype": "bf16 autocast" if bf16 else "fp32",
        "batch": batch,
        "flux": 1 / med["flux"],
        "torch": 1 / med["torch"],
        "ratio": med["torch"] / med["flux"],
    }


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=64, help="ResNet input height and width")
    p.add_argument("--rounds", type=int, default=7, help="alternating timing rounds (median taken)")
    p.add_argument("--digits-steps", type=int, default=50, help="steps per round, digits CNN")
    p.add_argument("--resnet-steps", type=int, default=3, help="steps per round, ResNet")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--channels-last", action="store_true", help="models and inputs in channels-last")
    args = p.parse_args(argv)

    configs = [
        ("digits CNN 8x8", digits_cnn, (1, 8, 8), args.digits_steps, 10),
        (f"ResNet-18 convs {args.size}x{args.size}", resnet18_like, (3, args.size, args.size), args.resnet_steps, 2),
    ]
    layout = "channels-last" if args.channels_last else "NCHW"
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads, {layout}; steps/s, median of {args.rounds} rounds")
    print("| model | dtype | batch | flux_dnn steps/s | torch steps/s | flux/torch |")
    print("|---|---|---|---|---|---|")
    rows = []
    for name, build, shape, steps, warmup in configs:
        for dt in args.dtypes.split(","):
            r = bench(name, build, shape, args.batch, dt == "bf16", args.rounds, steps, warmup, args.channels_last)
            rows.append(r)
            print(
                f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['flux']:.2f} | {r['torch']:.2f} | "
                f"{r['ratio']:.2f}x |",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    main()
