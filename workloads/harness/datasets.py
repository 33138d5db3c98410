"""Image datasets for the workloads: the real ones from disk, or synthetic.

Real data is read by torchvision's own dataset classes from ``--data-dir``
(never downloaded; the nodes may have no network), so the on-disk formats
are the standard ones. When the dataset's folder is absent and ``--data auto``
is in force, a synthetic dataset of the same shape and class count stands
in, and everything says so: ``data: "synthetic"`` in the result and in the
first log line. A folder that exists but is incomplete is an error, never a
silent fallback.

Every image dataset here yields its images as stored: uint8, at the
dataset's own size (``StoredImages``); what a model needs of them (float,
augmentation, CIFAR-10 upscaled to 224x224, normalisation) is done on the
rank's device, a batch at a time (``ImagePipeline``). The synthetic images
take the same path: a uint8 set drawn once from a fixed seed (like a dataset
on disk, independent of ``--seed``), with learnable structure, the same
sample for the same index on every rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

from workloads.harness.context import DistContext, WorkloadError
from workloads.harness.data import Batch


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
SYNTHETIC_BLOCK = 256  # samples drawn per seeded block: sample i is the same for any size
# On the CPU a batch is resized this many images at a time: 128 CIFAR-10
# images to 224x224 in one call took 1.6x the CPU per image of 8 at a time
# (one thread, bench/data_path.py's after-cpu), the output no longer in cache.
CPU_CHUNK = 8


class ImagePipeline:
    """What a batch of stored images goes through on its device, all at once.

    The loader ships each batch at its stored size and type (uint8; CIFAR-10
    at 32x32, 1.5 MB for 512 images, pinned, copied ``non_blocking``); this
    turns it into the model's input where the model runs:

    uint8 -> [0, 1] float (``ToTensor``'s x / 255) -> normalise -> [augment]
    -> [channels_last] -> [resize]

    One batched ``interpolate`` upscales every image (seed 001's 224x224: the
    same images the tutorial trains on, the work moved off the CPU, where a
    per-sample resize held a GPU at a third of its speed). Everything else
    runs on the stored size, before it: bilinear resizing and reflect
    padding only weigh pixels, so normalising first gives the same images
    (to float rounding) at a fiftieth of the work for 224x224. Augmentation (a
    random 4-pixel reflect-padded crop and a horizontal flip per image) draws
    from a generator on the device, which ``harness.data.seed_epoch`` seeds
    per rank and epoch, so ranks draw different crops, a resumed run the
    same ones, and no random number crosses to the host.
    """

    def __init__(self, spec: Spec, image_size: int | None = None, augment: bool = False,
                 channels_last: bool = False):
        self.mean, self.std = spec.mean, spec.std
        native = spec.shape[1]
        self.size = image_size if image_size and image_size != native else None
        self.augment = augment
        self.channels_last = channels_last
        self.generator: torch.Generator | None = None
        self._stats: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def seed(self, seed: int, device: torch.device) -> None:
        """Re-seed the augmentation's generator (on ``device``) for an epoch."""
        if self.augment:
            if self.generator is None or self.generator.device != device:
                self.generator = torch.Generator(device=device)
            self.generator.manual_seed(seed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self._on(x.device)
        x = x.float().div_(255).sub_(mean).div_(std)
        if self.augment:
            x = self._crop_and_flip(x)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)  # interpolate keeps it
        if self.size is not None:
            if x.device.type == "cpu" and len(x) > CPU_CHUNK:
                return torch.cat([self._resize(part) for part in x.split(CPU_CHUNK)])
            x = self._resize(x)
        return x

    def _resize(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=(self.size, self.size), mode="bilinear",
                             align_corners=False, antialias=self.size < x.shape[-1])

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._stats:
            self._stats[device] = (torch.tensor(self.mean, device=device).view(1, -1, 1, 1),
                                   torch.tensor(self.std, device=device).view(1, -1, 1, 1))
        return self._stats[device]

    def _crop_and_flip(self, x: torch.Tensor) -> torch.Tensor:
        """Each image cropped at its own offset from its 4-pixel reflect
        padding, and flipped or not: one gather for the whole batch."""
        if self.generator is None or self.generator.device != x.device:
            self.seed(0, x.device)  # unseeded use (a test): a fixed stream
        n, c, h, w = x.shape
        dev, g = x.device, self.generator
        padded = F.pad(x, (4, 4, 4, 4), mode="reflect")
        top = torch.randint(0, 9, (n, 1), device=dev, generator=g)
        left = torch.randint(0, 9, (n, 1), device=dev, generator=g)
        flip = torch.rand(n, 1, device=dev, generator=g) < 0.5
        rows = top + torch.arange(h, device=dev)
        cols = left + torch.arange(w, device=dev)
        cols = torch.where(flip, cols.flip(1), cols)
        return padded[torch.arange(n, device=dev).view(n, 1, 1, 1),
                      torch.arange(c, device=dev).view(1, c, 1, 1),
                      rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]


class StoredImages(Dataset):
    """Images at their stored size and type (uint8), and their labels.

    ``images`` holds N images as the dataset keeps them: N x H x W (MNIST's
    tensor), N x H x W x C (CIFAR-10's array, or its ``vision.SharedArray``)
    or N x C x H x W (the synthetic set); a sample comes out C x H x W, still
    uint8. ``__getitems__`` takes a whole batch in one indexing (DataLoader
    calls it with the batch's indices; ``Subset`` passes it on), so a batch
    costs one copy of its bytes, not a Python call per image.
    """

    def __init__(self, images, targets, channels_last_storage: bool = False):
        self.images = images
        self.targets = torch.as_tensor(targets, dtype=torch.int64)
        self.hwc = channels_last_storage

    def __len__(self) -> int:
        return len(self.targets)

    def _chw(self, picked) -> torch.Tensor:
        batch = picked if isinstance(picked, torch.Tensor) else torch.from_numpy(picked)
        if batch.dim() == 3:  # N x H x W: one channel
            return batch.unsqueeze(1)
        return batch.permute(0, 3, 1, 2).contiguous() if self.hwc else batch

    def __getitem__(self, index: int):
        return self._chw(self.images[index:index + 1])[0], int(self.targets[index])

    def __getitems__(self, indices: list[int]) -> Batch:
        return Batch(self._chw(self.images[indices]), self.targets[indices])


def synthetic_images(spec: Spec, size: int, split: str) -> StoredImages:
    """``size`` uint8 samples shaped like ``spec``; sample i is the same
    everywhere and for any ``size``.

    Each class is a smooth random pattern and each sample its class's pattern
    plus pixel noise, so accuracy climbs above chance and a broken loop would
    show. Drawn once, in blocks of ``SYNTHETIC_BLOCK`` seeded by their index:
    the set is held like a real one (CIFAR-10's 50000: 150 MB) and takes the
    real data's path.
    """
    c, h, w = spec.shape
    g = torch.Generator().manual_seed(SYNTHETIC_SEED)
    coarse = torch.randn(spec.num_classes, c, 4, 4, generator=g)
    patterns = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
    stream = SYNTHETIC_SEED * 7 + (0 if split == "train" else 1)
    images = torch.empty(size, c, h, w, dtype=torch.uint8)
    targets = torch.empty(size, dtype=torch.int64)
    for first in range(0, size, SYNTHETIC_BLOCK):
        n = min(SYNTHETIC_BLOCK, size - first)
        block = torch.Generator().manual_seed(stream * 1_000_003 + first // SYNTHETIC_BLOCK)
        labels = torch.randint(spec.num_classes, (SYNTHETIC_BLOCK,), generator=block)[:n]
        noise = torch.randn(SYNTHETIC_BLOCK, c, h, w, generator=block)[:n]
        pixels = (0.5 + 0.2 * patterns[labels] + 0.15 * noise).clamp_(0.0, 1.0)
        images[first:first + n] = pixels.mul_(255).round_().to(torch.uint8)
        targets[first:first + n] = labels
    return StoredImages(images, targets)


@dataclass
class ImageData:
    """Train/test datasets, the pipelines their batches take on the device,
    and an honest description of where they came from."""

    train: Dataset
    test: Dataset
    data: str  # "real" or "synthetic"
    source: str  # for the first log line
    verified: bool | None  # real data: did the checksums get verified?
    spec: Spec
    train_pipeline: ImagePipeline
    test_pipeline: ImagePipeline


def _first(ds: Dataset, n: int) -> Dataset:
    return Subset(ds, range(min(n, len(ds)))) if n > 0 else ds


def load(spec: Spec, data_dir: str, mode: str, *, train_samples: int = 0,
         test_samples: int = 0, image_size: int | None = None,
         augment: bool = False, channels_last: bool = False) -> ImageData:
    """The datasets for ``spec`` per ``--data`` (auto/real/synthetic); see module doc."""
    root = os.path.abspath(data_dir)
    present = os.path.isdir(os.path.join(root, spec.folder))
    if mode == "real" and not present:
        raise WorkloadError(f"--data real: no {spec.name} at {os.path.join(root, spec.folder)}")
    if mode not in ("auto", "real", "synthetic"):
        raise WorkloadError(f"--data must be auto, real or synthetic, got {mode!r}")
    pipelines = (ImagePipeline(spec, image_size, augment, channels_last),
                 ImagePipeline(spec, image_size, False, channels_last))
    if mode == "synthetic" or not present:
        why = "--data synthetic" if mode == "synthetic" else f"no {spec.folder} under {root}"
        train = synthetic_images(spec, train_samples or spec.train_size, "train")
        test = synthetic_images(spec, test_samples or spec.test_size, "test")
        return ImageData(train, test, "synthetic",
                         f"SYNTHETIC {spec.name}-shaped data, {why}", None, spec, *pipelines)
    from workloads.harness import vision  # torchvision is only imported for real data

    train, test, verified = vision.load_real(spec, root)
    note = ", md5 NOT verified" if verified is False else ""
    return ImageData(_first(train, train_samples), _first(test, test_samples), "real",
                     f"{spec.name} from {root}{note}", verified, spec, *pipelines)


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
