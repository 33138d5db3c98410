"""Image datasets for the workloads: the real ones from disk, or synthetic.

Real data is read by torchvision's own dataset classes from ``--data-dir``
(never downloaded; the nodes may have no network), so the on-disk formats
are the standard ones. When the dataset's folder is absent and ``--data auto``
is in force, a synthetic dataset of the same shape and class count stands
in, and everything says so: ``data: "synthetic"`` in the result and in the
first log line. A folder that exists but is incomplete is an error, never a
silent fallback.

The synthetic images have learnable structure -- each class is a smooth
random pattern, each sample that pattern plus pixel noise -- so accuracy
climbs above chance and a broken training loop would show. They are drawn
from a fixed seed (like a dataset on disk, independent of ``--seed``) and
generated per index on the fly: nothing big is held in memory and every
rank sees the same sample for the same index.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

from workloads.harness.context import DistContext, WorkloadError


@dataclass(frozen=True)
class Spec:
    """What a dataset looks like: its folder under the root, shape, sizes, stats."""

    name: str
    folder: str  # relative to --data-dir; its presence means "real data here"
    shape: tuple[int, int, int]
    num_classes: int
    train_size: int
    test_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


MNIST = Spec("MNIST", os.path.join("MNIST", "raw"), (1, 28, 28), 10, 60000, 10000,
             (0.1307,), (0.3081,))
CIFAR10 = Spec("CIFAR-10", "cifar-10-batches-py", (3, 32, 32), 10, 50000, 10000,
               (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))

SYNTHETIC_SEED = 20240601  # fixed: the synthetic set is "a dataset", not a run choice


class ImagePipeline:
    """Tensor-side preprocessing shared by real and synthetic images.

    [augment] -> [resize] -> normalise, on a CxHxW float tensor in [0, 1].
    Augmentation (random 4-pixel-padded crop + horizontal flip) draws from
    torch's default generator, which the harness re-seeds per rank and epoch
    in the main process and DataLoader seeds per worker from the rank's
    loader generator.
    """

    def __init__(self, spec: Spec, image_size: int | None = None, augment: bool = False):
        self.mean = torch.tensor(spec.mean).view(-1, 1, 1)
        self.std = torch.tensor(spec.std).view(-1, 1, 1)
        native = spec.shape[1]
        self.size = image_size if image_size and image_size != native else None
        self.augment = augment

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.augment:
            _, h, w = x.shape
            padded = F.pad(x[None], (4, 4, 4, 4), mode="reflect")[0]
            i, j = torch.randint(0, 9, (2,)).tolist()
            x = padded[:, i:i + h, j:j + w]
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
        if self.size is not None:
            x = F.interpolate(x[None], size=(self.size, self.size), mode="bilinear",
                              align_corners=False, antialias=self.size < x.shape[-1])[0]
        return (x - self.mean) / self.std


class SyntheticImages(Dataset):
    """``size`` samples shaped like ``spec``; sample i is the same everywhere."""

    def __init__(self, spec: Spec, size: int, split: str, transform=None):
        c, h, w = spec.shape
        g = torch.Generator().manual_seed(SYNTHETIC_SEED)
        coarse = torch.randn(spec.num_classes, c, 4, 4, generator=g)
        self.patterns = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
        self.stream = SYNTHETIC_SEED * 7 + (0 if split == "train" else 1)
        labels_g = torch.Generator().manual_seed(self.stream)
        self.targets = torch.randint(spec.num_classes, (size,), generator=labels_g)
        self.shape = spec.shape
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(self.stream * 1_000_003 + index)
        label = int(self.targets[index])
        noise = torch.randn(self.shape, generator=g)
        x = (0.5 + 0.2 * self.patterns[label] + 0.15 * noise).clamp_(0.0, 1.0)
        if self.transform is not None:
            x = self.transform(x)
        return x, label


@dataclass
class ImageData:
    """Train/test datasets plus an honest description of where they came from."""

    train: Dataset
    test: Dataset
    data: str  # "real" or "synthetic"
    source: str  # for the first log line
    verified: bool | None  # real data: did the checksums get verified?
    spec: Spec


def _first(ds: Dataset, n: int) -> Dataset:
    return Subset(ds, range(min(n, len(ds)))) if n > 0 else ds


def load(spec: Spec, data_dir: str, mode: str, *, train_samples: int = 0,
         test_samples: int = 0, image_size: int | None = None,
         augment: bool = False) -> ImageData:
    """The datasets for ``spec`` per ``--data`` (auto/real/synthetic); see module doc."""
    root = os.path.abspath(data_dir)
    present = os.path.isdir(os.path.join(root, spec.folder))
    if mode == "real" and not present:
        raise WorkloadError(f"--data real: no {spec.name} at {os.path.join(root, spec.folder)}")
    if mode not in ("auto", "real", "synthetic"):
        raise WorkloadError(f"--data must be auto, real or synthetic, got {mode!r}")
    train_tf = ImagePipeline(spec, image_size, augment)
    test_tf = ImagePipeline(spec, image_size, False)
    if mode == "synthetic" or not present:
        why = "--data synthetic" if mode == "synthetic" else f"no {spec.folder} under {root}"
        train = SyntheticImages(spec, train_samples or spec.train_size, "train", train_tf)
        test = SyntheticImages(spec, test_samples or spec.test_size, "test", test_tf)
        return ImageData(train, test, "synthetic",
                         f"SYNTHETIC {spec.name}-shaped data, {why}", None, spec)
    from workloads.harness import vision  # torchvision is only imported for real data

    train, test, verified = vision.load_real(spec, root, train_tf, test_tf)
    note = ", md5 NOT verified" if verified is False else ""
    return ImageData(_first(train, train_samples), _first(test, test_samples), "real",
                     f"{spec.name} from {root}{note}", verified, spec)


def check_same_everywhere(ctx: DistContext, data: ImageData) -> None:
    """Refuse a job whose ranks would train on different data; a collective.

    Each rank looks for ``--data-dir`` on its own node, so with ``--data
    auto`` a node without the dataset would quietly train on the synthetic
    set while node 0 -- whose result is the one reported -- says "real".
    Every rank raises the same error, naming what each node found.
    """
    from workloads.harness.evidence import all_gather_json

    everyone = all_gather_json(ctx, [data.data, ctx.node_rank, ctx.hostname, data.source])
    if len({kind for kind, *_ in everyone}) == 1:
        return
    nodes: dict[tuple[int, str], str] = {}
    for _kind, node_rank, host, source in everyone:
        nodes.setdefault((node_rank, host), source)
    found = "; ".join(f"node {n} ({h}): {src}" for (n, h), src in sorted(nodes.items()))
    raise WorkloadError(f"the ranks would train on different data: {found}. Put the "
                        f"{data.spec.name} files at data_dir on every node (an absolute path), "
                        "or pass --data synthetic to train on the synthetic set everywhere")
