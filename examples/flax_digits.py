"""Train a Flax (nnx) CNN on scikit-learn's digits (8x8 images, no download) with flux_dnn's
convolutions, and print the test accuracy.

    python examples/flax_digits.py           # nnx.Conv(conv_general_dilated=flux_dnn.jax.conv_general_dilated)
    python examples/flax_digits.py --lax     # the same model on jax.lax.conv_general_dilated
    python examples/flax_digits.py --quick   # 2 epochs, a smoke run

Flax's Conv takes the convolution function as a parameter, so switching a model to flux_dnn
is that one argument; both variants start from identical parameters for a given seed.
Needs flax and optax (pip install flax optax) and scikit-learn.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import flux_dnn.jax as fj


def load_digits_split(seed: int = 0):
    """(x_train, y_train, x_test, y_test): images (N, 8, 8, 1) float32 in [0, 1] (NHWC, Flax's
    layout), a stratified 80/20 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    return train_test_split(x, digits.target, test_size=0.2, random_state=seed, stratify=digits.target)


class CNN(nnx.Module):
    def __init__(self, conv_general_dilated, rngs: nnx.Rngs):
        conv = dict(conv_general_dilated=conv_general_dilated, rngs=rngs)
        self.c1 = nnx.Conv(1, 16, (3, 3), padding="SAME", **conv)
        self.c2 = nnx.Conv(16, 32, (3, 3), strides=2, padding="SAME", **conv)
        self.c3 = nnx.Conv(32, 32, (3, 3), padding="SAME", feature_group_count=4, **conv)
        self.head = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.c1(x))
        x = nnx.relu(self.c2(x))
        x = nnx.relu(self.c3(x))
        return self.head(x.mean(axis=(1, 2)))


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def predict(model, x):
    return jnp.argmax(model(x), axis=-1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lax", action="store_true", help="use jax.lax.conv_general_dilated instead of flux_dnn")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="2 epochs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    epochs = 2 if args.quick else args.epochs

    x_train, x_test, y_train, y_test = load_digits_split(args.seed)
    conv = jax.lax.conv_general_dilated if args.lax else fj.conv_general_dilated
    model = CNN(conv, nnx.Rngs(args.seed))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    order = np.random.default_rng(args.seed)
    start = time.perf_counter()
    for epoch in range(epochs):
        perm = order.permutation(len(x_train))
        losses = [
            float(train_step(model, optimizer, x_train[perm[i : i + 64]], y_train[perm[i : i + 64]]))
            for i in range(0, len(perm), 64)
        ]
        print(f"epoch {epoch + 1:2d}: loss {np.mean(losses):.4f}")
    accuracy = float(np.mean(np.asarray(predict(model, x_test)) == y_test))
    backend = "jax.lax" if args.lax else f"flux_dnn ({'XLA FFI' if fj.ffi_available() else 'pure_callback'})"
    print(f"{backend}: test accuracy {accuracy:.3f} after {epochs} epochs, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
