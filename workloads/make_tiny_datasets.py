"""Write a tiny MNIST and CIFAR-10 in their genuine on-disk formats.

    python -m workloads.make_tiny_datasets DATA_DIR [--train 200] [--test 50]

For smoke-testing the *real* data path (torchvision's readers, ``data:
"real"`` in the result) on machines without the datasets or a network:

* ``DATA_DIR/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` -- the
  big-endian idx files torchvision's MNIST reads (it checks presence only);
* ``DATA_DIR/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``
  -- the pickled dicts of the CIFAR-10 python release (``data`` an (N, 3072)
  uint8 array in channel-major order, ``labels`` a list). Their md5s differ
  from the official files, so the workloads read them through
  ``UnverifiedCIFAR10`` and report ``data_verified: false``.

Images are class-dependent patterns plus noise, so a model can learn them.
Needs numpy only (no torch), so it can run anywhere.
"""

from __future__ import annotations

import argparse
import os
import pickle
import struct

import numpy as np

CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck"]


def _images(rng: np.random.Generator, n: int, shape: tuple[int, ...],
            patterns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """n uint8 images: the pattern of a random class plus noise, and labels."""
    labels = rng.integers(0, len(patterns), size=n)
    pixels = patterns[labels] + rng.normal(0, 30, size=(n, *shape))
    return np.clip(pixels, 0, 255).astype(np.uint8), labels.astype(np.uint8)


def _patterns(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """One smooth-ish pattern per class: a random 4x4 grid blown up to size."""
    *lead, h, w = shape
    coarse = rng.uniform(30, 225, size=(10, *lead, 4, 4))
    return coarse.repeat(h // 4, axis=-2).repeat(w // 4, axis=-1)


def _write_idx(path: str, array: np.ndarray) -> None:
    """idx format: 0x0000, dtype code 0x08 (ubyte), ndim, big-endian dims, data."""
    with open(path, "wb") as fh:
        fh.write(struct.pack(">HBB", 0, 0x08, array.ndim))
        fh.write(struct.pack(f">{array.ndim}I", *array.shape))
        fh.write(np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def write_mnist(root: str, train: int, test: int, seed: int = 0) -> str:
    """Write ``root/MNIST/raw``; returns that folder."""
    rng = np.random.default_rng(seed)
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    patterns = _patterns(rng, (28, 28))
    for prefix, n in (("train", train), ("t10k", test)):
        images, labels = _images(rng, n, (28, 28), patterns)
        _write_idx(os.path.join(raw, f"{prefix}-images-idx3-ubyte"), images)
        _write_idx(os.path.join(raw, f"{prefix}-labels-idx1-ubyte"), labels)
    return raw


def write_cifar10(root: str, train: int, test: int, seed: int = 1) -> str:
    """Write ``root/cifar-10-batches-py`` (train split over 5 batches); returns it."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    patterns = _patterns(rng, (3, 32, 32))
    sizes = [train // 5 + (1 if i < train % 5 else 0) for i in range(5)]
    batches = [(f"data_batch_{i + 1}", f"training batch {i + 1} of 5", n)
               for i, n in enumerate(sizes)] + [("test_batch", "testing batch 1 of 1", test)]
    for name, label, n in batches:
        images, labels = _images(rng, n, (3, 32, 32), patterns)
        entry = {"batch_label": label, "labels": [int(v) for v in labels],
                 "data": images.reshape(n, 3 * 32 * 32),
                 "filenames": [f"tiny_{name}_{i}.png" for i in range(n)]}
        with open(os.path.join(folder, name), "wb") as fh:
            pickle.dump(entry, fh, protocol=2)
    meta = {"label_names": CIFAR_CLASSES, "num_cases_per_batch": max(sizes), "num_vis": 3072}
    with open(os.path.join(folder, "batches.meta"), "wb") as fh:
        pickle.dump(meta, fh, protocol=2)
    return folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="workloads.make_tiny_datasets",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir")
    parser.add_argument("--train", type=int, default=200, help="training images per dataset")
    parser.add_argument("--test", type=int, default=50, help="test images per dataset")
    args = parser.parse_args(argv)
    print(write_mnist(args.data_dir, args.train, args.test))
    print(write_cifar10(args.data_dir, args.train, args.test))


if __name__ == "__main__":
    main()
