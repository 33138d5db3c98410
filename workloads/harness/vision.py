"""Real MNIST / CIFAR-10 through torchvision's dataset classes (download=False).

torchvision reads and decodes the files; its images are then served as
stored, uint8 (``datasets.StoredImages``), not through its per-sample PIL
path: the rank's device does the rest (``datasets.ImagePipeline``).

Imported only when real data is present: importing torchvision costs a few
seconds per process (it pulls in torch._dynamo), which noop/linear/toy and
synthetic runs need not pay.

CIFAR-10's decoded images are one numpy array (150 MB for the full set).
DataLoader workers are started afresh every epoch (``harness.data``: that is
how each epoch reseeds them), and each start pickles the dataset into the
new worker: by value, the whole array, per worker per rank per epoch.
``SharedArray`` moves it into shared memory on the first such pickle, so
every later one sends a handle to the same pages (torch's multiprocessing
reductions), and the rank holds one copy instead of one per worker. MNIST
needs nothing of the kind: torchvision keeps it in a tensor, which the same
reductions already share.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torchvision import datasets

from workloads.harness.context import WorkloadError
from workloads.harness.datasets import CIFAR10, MNIST, Spec, StoredImages


class UnverifiedCIFAR10(datasets.CIFAR10):
    """torchvision's CIFAR10 minus the md5 comparison, nothing else.

    The stock class refuses any batch file whose md5 differs from the
    official release, so a small dataset written in the genuine format (the
    tests' tiny CIFAR-10, or a trimmed copy on a node) cannot be opened. This
    subclass keeps the real reader -- the same pickle batches, the same
    ``batches.meta`` -- and only sets the expected checksums to None, which
    torchvision's ``check_integrity`` treats as "file exists". It is used only
    after the stock class has refused the files, and the result then says
    ``data_verified: false``.
    """

    train_list = [[name, None] for name, _ in datasets.CIFAR10.train_list]
    test_list = [[name, None] for name, _ in datasets.CIFAR10.test_list]
    meta = {**datasets.CIFAR10.meta, "md5": None}


class SharedArray:
    """An array indexed like the numpy one it wraps, pickled as a shared tensor.

    Unpickled, it is a numpy view of the same shared pages (no copy). Moving
    the array waits for the first pickle, so a run without loader workers
    never touches shared memory (/dev/shm, which containers often keep small).
    """

    def __init__(self, array: Any, shared: torch.Tensor | None = None):
        self.array, self.shared = array, shared

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: Any) -> Any:
        return self.array[index]

    def __reduce__(self):
        if self.shared is None:
            self.shared = torch.from_numpy(self.array).share_memory_()
            self.array = self.shared.numpy()  # drop the private copy: one per rank
        return _from_shared, (self.shared,)


def _from_shared(shared: torch.Tensor) -> SharedArray:
    return SharedArray(shared.numpy(), shared)


def _cifar10(root: str, train: bool) -> tuple[StoredImages, bool]:
    try:
        ds, verified = datasets.CIFAR10(root, train=train, download=False), True
    except RuntimeError as official:
        folder = os.path.join(root, CIFAR10.folder)
        names = [n for n, _ in UnverifiedCIFAR10.train_list + UnverifiedCIFAR10.test_list]
        missing = [n for n in names + ["batches.meta"]
                   if not os.path.isfile(os.path.join(folder, n))]
        if missing:
            raise WorkloadError(f"CIFAR-10 at {folder} is incomplete (missing {missing})") \
                from official
        ds, verified = UnverifiedCIFAR10(root, train=train, download=False), False
    # N x 32 x 32 x 3 uint8, as decoded; into shared memory at a worker's start
    return StoredImages(SharedArray(ds.data), ds.targets, channels_last_storage=True), verified


def load_real(spec: Spec, root: str) -> tuple[StoredImages, StoredImages, bool | None]:
    """(train, test, verified) for ``spec`` from ``root``: torchvision's
    readers, their decoded uint8 images served as stored (no PIL per sample)."""
    if spec is MNIST:
        try:
            train = datasets.MNIST(root, train=True, download=False)
            test = datasets.MNIST(root, train=False, download=False)
        except RuntimeError as err:
            raise WorkloadError(f"MNIST under {root}/{spec.folder} is incomplete: {err}") from err
        # torchvision checks MNIST's raw files for presence only (no md5); its
        # images are one uint8 tensor, which DataLoader's workers share as is
        return (StoredImages(train.data, train.targets), StoredImages(test.data, test.targets),
                None)
    if spec is CIFAR10:
        train, ok_train = _cifar10(root, True)
        test, ok_test = _cifar10(root, False)
        return train, test, ok_train and ok_test
    raise WorkloadError(f"no real loader for {spec.name}")
