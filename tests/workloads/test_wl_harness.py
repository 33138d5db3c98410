"""Unit tests of the harness pieces that need no process group."""

from __future__ import annotations

import os

import pytest
import torch

from workloads.harness import data as hdata
from workloads.harness import datasets
from workloads.harness.context import (CudaView, WorkloadError, normalise_gpu_uuid,
                                       planned_gpu_mismatch, read_context, resolve_device)
from workloads.harness.timing import CappedSeries, StepTimer

TORCHRUN_ENV = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1",
                "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
                "CUDA_VISIBLE_DEVICES": "2,3", "DDP_ORCH_RUN_ID": "r-7",
                "DDP_ORCH_RESULT_FILE": "/x/result.json"}
UUID_A = "GPU-1a2b3c4d-0000-1111-2222-333344445555"
UUID_B = "GPU-9f8e7d6c-0000-1111-2222-333344445555"


def gpus(count: int, available: bool = True, build: str | None = "12.8"):
    """A stand-in for ``probe_cuda``: what torch would report."""
    return lambda: CudaView(build, available, count)


no_gpu, two_gpus = gpus(0, available=False, build=None), gpus(2)


def must_not_ask() -> CudaView:
    raise AssertionError("a cpu run must not query CUDA")


# --- context ---------------------------------------------------------------

def test_context_reads_torchrun_and_orchestrator_variables():
    ctx = read_context(TORCHRUN_ENV, cuda=two_gpus, hostname="h1")
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.node_rank, ctx.local_world_size) \
        == (3, 1, 4, 1, 2)
    assert (ctx.device, ctx.backend) == ("cuda:1", "nccl")
    assert ctx.launched and not ctx.is_rank0
    assert ctx.cuda_visible_devices == "2,3" and ctx.run_id == "r-7"
    assert ctx.result_file == "/x/result.json" and ctx.hostname == "h1"


def test_context_device_cpu_ignores_visible_gpus():
    env = {**TORCHRUN_ENV, "DDP_ORCH_DEVICE": "cpu"}
    ctx = read_context(env, cuda=must_not_ask)
    assert (ctx.device, ctx.backend) == ("cpu", "gloo")
    assert ctx.cuda_visible_devices == "2,3"  # still reported, just not used


def test_device_flag_overrides_the_environment():
    env = {**TORCHRUN_ENV, "DDP_ORCH_DEVICE": "cuda"}
    assert read_context(env, "cpu", cuda=must_not_ask).device == "cpu"


def test_context_alone_is_a_job_of_one():
    ctx = read_context({}, cuda=no_gpu)
    assert (ctx.rank, ctx.world_size, ctx.node_rank, ctx.launched) == (0, 1, 0, False)
    assert ctx.is_rank0 and ctx.device == "cpu" and ctx.requested_device == "auto"
    assert ctx.result_file is None and ctx.run_id is None


def test_context_is_frozen():
    ctx = read_context({}, cuda=no_gpu)
    with pytest.raises(AttributeError):
        ctx.rank = 1  # type: ignore[misc]


def test_read_context_does_not_touch_os_environ():
    before = dict(os.environ)
    read_context(TORCHRUN_ENV, cuda=two_gpus)
    assert dict(os.environ) == before


@pytest.mark.parametrize("requested,local_rank,local_world,view,expected", [
    ("auto", 1, 2, two_gpus, ("cuda:1", "nccl", None)),
    ("cuda", 0, 1, gpus(1), ("cuda:0", "nccl", None)),
    ("cpu", 0, 1, must_not_ask, ("cpu", "gloo", None)),
])
def test_resolve_device(requested, local_rank, local_world, view, expected):
    assert resolve_device(requested, local_rank, local_world, view, "0,1") == expected


@pytest.mark.parametrize("view", [no_gpu, gpus(2, available=False), gpus(0)])
def test_device_cuda_without_a_usable_gpu_fails_at_once_saying_what_torch_sees(view):
    """Never a quiet CPU run: the one line names torch's build, availability,
    device count and CUDA_VISIBLE_DEVICES."""
    seen = view()
    with pytest.raises(WorkloadError) as err:
        resolve_device("cuda", 0, 1, view, "3")
    message = str(err.value)
    assert "\n" not in message and "no CUDA device" in message
    assert f"built for CUDA {seen.build}" in message
    assert f"torch.cuda.is_available() is {seen.available}" in message
    assert f"torch.cuda.device_count() is {seen.count}" in message
    assert "CUDA_VISIBLE_DEVICES='3'" in message


@pytest.mark.parametrize("requested", ["cuda", "auto"])
def test_fewer_gpus_than_local_ranks_fails_on_every_local_rank(requested):
    """Local rank 0 of 3 fails too, not only the rank past the last GPU."""
    for local_rank in range(3):
        with pytest.raises(WorkloadError, match="3 processes on this node need a GPU each but "
                                                "only 2") as err:
            resolve_device(requested, local_rank, 3, two_gpus, "0,1")
        assert "CUDA_VISIBLE_DEVICES='0,1'" in str(err.value)


def test_auto_without_a_gpu_falls_back_to_cpu_with_the_reason():
    place = resolve_device("auto", 0, 1, no_gpu, None)
    assert (place.device, place.backend) == ("cpu", "gloo")
    assert "device auto found no usable GPU" in place.fallback
    assert "CUDA_VISIBLE_DEVICES=(unset)" in place.fallback and "\n" not in place.fallback
    assert read_context({}, cuda=no_gpu).fallback == place.fallback
    assert read_context({}, "cpu", cuda=must_not_ask).fallback is None


def test_an_unknown_device_is_refused():
    with pytest.raises(WorkloadError, match="device must be one of"):
        resolve_device("gpu", 0, 1, must_not_ask, None)


def test_context_reads_device_order_and_planned_gpus():
    env = {**TORCHRUN_ENV, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "DDP_ORCH_GPU_UUIDS": f"{UUID_A}, {UUID_B}"}
    ctx = read_context(env, cuda=two_gpus)
    assert ctx.cuda_device_order == "PCI_BUS_ID"
    assert ctx.planned_gpu_uuids == (UUID_A, UUID_B)
    assert read_context(TORCHRUN_ENV, cuda=two_gpus).planned_gpu_uuids == ()


# --- GPU identity ------------------------------------------------------------

def test_torch_uuids_take_nvidia_smis_form():
    assert normalise_gpu_uuid(UUID_A[4:]) == UUID_A
    assert normalise_gpu_uuid(UUID_A) == UUID_A
    assert normalise_gpu_uuid("MIG-" + UUID_A[4:]) == "MIG-" + UUID_A[4:]


@pytest.mark.parametrize("planned,local_rank,actual", [
    ((), 0, UUID_A),  # nothing planned: nothing to check
    ((UUID_A, UUID_B), 1, UUID_B),
    ((UUID_A,), 0, UUID_A[4:].upper()),  # torch's bare form, any case
    (("MIG-" + UUID_A[4:],), 0, UUID_A),
])
def test_the_planned_gpu_passes(planned, local_rank, actual):
    assert planned_gpu_mismatch(planned, local_rank, actual) is None


def test_another_gpu_than_planned_is_named_with_the_usual_cause():
    message = planned_gpu_mismatch((UUID_A, UUID_B), 0, UUID_B)
    assert f"local rank 0 is on GPU {UUID_B} but ddp-orch planned {UUID_A}" in message
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in message and "usual cause" in message


def test_a_local_rank_past_the_planned_list_is_refused():
    assert "local rank 2 has no planned GPU" in planned_gpu_mismatch((UUID_A, UUID_B), 2,
                                                                     UUID_A)


# --- data splitting and seeding ---------------------------------------------

def test_global_batch_is_dealt_to_any_world_size():
    """The rule: rank r takes every W-th sample of the global batch from r."""
    assert hdata.split_batch(32, 2).shares == [16, 16]
    assert hdata.split_batch(32, 1).shares == [32]
    assert hdata.split_batch(32, 7).shares == [5, 5, 5, 5, 4, 4, 4]
    assert hdata.split_batch(4, 7).shares == [1, 1, 1, 1, 0, 0, 0]
    assert (str(hdata.split_batch(32, 2)), str(hdata.split_batch(32, 7))) \
        == ("32 = 2 x 16", "32 = 4 x 5 + 3 x 4")
    assert hdata.split_batch(32, 7).largest == 5 and hdata.split_batch(4, 7).largest == 1
    assert hdata.split_batch(32, 2).loss_weight(16, 32) == 1.0
    with pytest.raises(WorkloadError, match="must be positive"):
        hdata.split_batch(0, 1)


@pytest.mark.parametrize("world", [2, 3, 7])
def test_weighted_rank_gradients_average_to_the_global_batch_gradient(world):
    """What DDP computes -- the mean over ranks of each rank's gradient of its
    weighted mean loss -- is the gradient of the mean loss over the batch."""
    from torch import nn

    torch.manual_seed(0)
    model, loss_fn = nn.Linear(3, 1), nn.MSELoss()
    x, y = torch.randn(11, 3), torch.randn(11, 1)
    split = hdata.split_batch(11, world)

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    whole = grads(loss_fn(model(x), y))
    ranks = [grads(loss_fn(model(x[r::world]), y[r::world])
                   * split.loss_weight(split.share(r), 11)) for r in range(world)]
    assert torch.allclose(torch.stack(ranks).mean(0), whole, atol=1e-6)


def test_lr_scaling_is_explicit():
    assert hdata.scaled_lr(0.01, "none", 4) == 0.01
    assert hdata.scaled_lr(0.01, "linear", 4) == pytest.approx(0.04)
    with pytest.raises(WorkloadError):
        hdata.scaled_lr(0.01, "sqrt", 4)


def test_epoch_seeds_differ_per_rank_and_epoch_and_repeat():
    seeds = {hdata.epoch_seed(42, r, e) for r in range(8) for e in range(50)}
    assert len(seeds) == 400
    assert hdata.epoch_seed(42, 1, 3) == hdata.epoch_seed(42, 1, 3)
    assert all(0 <= s < 2**63 for s in seeds)


def test_shard_sampler_covers_each_index_exactly_once():
    data = list(range(11))
    shards = [list(hdata.ShardSampler(data, r, 4)) for r in range(4)]
    assert sorted(i for s in shards for i in s) == data
    assert [len(s) for s in shards] == [3, 3, 3, 2]


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("shuffle", [True, False])
def test_rank_batches_union_to_the_single_process_batches(shuffle, world):
    """The property the DDP/single-process equivalence rests on, for any world
    size: same steps, each step's union is the one-process batch, no padding."""
    n, batch = 23, 5
    one = hdata.split_batch(batch, 1)
    single = hdata.GlobalBatchSampler(n, one, 0, shuffle=shuffle, seed=5)
    split = hdata.split_batch(batch, world)
    ranks = [hdata.GlobalBatchSampler(n, split, r, shuffle=shuffle, seed=5)
             for r in range(world)]
    for sampler in (single, *ranks):
        sampler.set_epoch(3)
    steps = [list(s) for s in ranks]
    assert {len(s) for s in steps} == {len(single)} == {5}
    for k, whole in enumerate(single):
        union = [i for s in steps for i in s[k]]
        assert sorted(union) == sorted(whole)
        assert [len(s[k]) for s in steps] == [split.share(r, len(whole)) for r in range(world)]
        assert ranks[0].global_size(k) == len(whole)
    assert sorted(i for s in steps for b in s for i in b) == list(range(n))
    assert [s.has_empty_share() for s in ranks] == [r >= 3 for r in range(world)]


def test_distributed_sampler_is_the_even_case():
    """When W divides the batch and the data, a rank's batches are its
    DistributedSampler shard, batched: the old even split, unchanged."""
    from torch.utils.data import DistributedSampler

    split = hdata.split_batch(8, 2)
    for rank in range(2):
        ours = [i for b in hdata.GlobalBatchSampler(24, split, rank, shuffle=True, seed=5)
                for i in b]
        assert ours == list(DistributedSampler(range(24), num_replicas=2, rank=rank, seed=5))


def test_an_empty_share_collates_to_zero_rows():
    from torch.utils.data import TensorDataset

    data = TensorDataset(torch.randn(5, 2), torch.arange(5))
    ctx = read_context({"RANK": "6", "WORLD_SIZE": "7", "LOCAL_RANK": "6"}, "cpu")
    shapes = [(tuple(x.shape), tuple(y.shape))
              for x, y in hdata.train_loader(data, ctx, 4, seed=1, shuffle=False)]
    assert shapes == [((0, 2), (0,)), ((0, 2), (0,))]


# --- timing -----------------------------------------------------------------

def test_capped_series_strides_evenly_and_stays_bounded():
    series = CappedSeries(cap=10)
    for step in range(1000):
        series.add(step, float(step))
    rows = series.rows
    assert 5 <= len(rows) <= 10
    steps = [r[0] for r in rows]
    assert steps[0] == 0 and len({b - a for a, b in zip(steps, steps[1:])}) == 1


def test_step_timer_summary():
    timer = StepTimer(cap=4)
    for step in range(10):
        timer.record(step, 0.01, 0.03)
    s = timer.summary(global_samples=320)
    assert s["steps"] == 10
    assert s["avg_data_s"] == pytest.approx(0.01)
    assert s["avg_compute_s"] == pytest.approx(0.03)
    assert s["avg_batch_s"] == pytest.approx(0.04)
    assert s["samples_per_s"] == pytest.approx(800)
    assert len(s["series"]["rows"]) <= 4 and s["series"]["columns"][0] == "step"


class ScriptedMarks:
    """Marks at the times given, in order; a mark is passed once ``upto``
    has reached it (a device that lags), as CUDA events are."""

    def __init__(self, *times: float):
        self.times, self.made, self.upto = list(times), 0, 0

    def mark(self) -> int:
        self.made += 1
        return self.made - 1

    def passed(self, mark: int) -> bool:
        return mark < self.upto

    def wait(self, mark: int) -> None:
        self.upto = len(self.times)

    def seconds(self, start: int, end: int) -> float:
        return self.times[end] - self.times[start]


def test_a_steps_times_from_its_marks_read_once_the_device_has_passed_them():
    """Two steps: begin, forward, two gradient buckets, backward, end, idle;
    times worked out by hand. The first step's data time is the host's
    wait; the next one's is from the last idle mark to its begin; the
    all-reduce's exposed wait is from the last bucket to backward's end."""
    from workloads.harness.timing import StepClock

    marks = ScriptedMarks(1, 3, 5, 6, 7, 9, 10,  # step 0: begin .. idle
                          12, 13, 15, 15.5, 18, 19)  # step 1: begin .. end
    clock = StepClock(marks)
    clock.begin(0, 0.25)
    clock.forward_done(), clock.grads_ready(), clock.grads_ready()
    clock.backward_done(), clock.end(), clock.idle()
    clock.begin(1, 99.0)
    clock.forward_done(), clock.grads_ready(), clock.grads_ready(), clock.backward_done()
    clock.end()
    assert clock.ready() == []  # the device is behind: nothing read, nothing waited for
    marks.upto = 6  # past step 0's end, not step 1's
    assert clock.ready() == [(0, 0.25, 8, 2, 1)]
    assert clock.ready() == []
    assert clock.drain() == [(1, 2, 7, 1, 2.5)]
    clock.forward_done()  # outside a step: no mark
    assert clock.drain() == []


# --- datasets -----------------------------------------------------------------

@pytest.mark.parametrize("spec", [datasets.MNIST, datasets.CIFAR10])
def test_synthetic_images_have_the_real_shape_and_are_deterministic(spec):
    a = datasets.synthetic_images(spec, 50, "train")
    b = datasets.synthetic_images(spec, 300, "train")  # past a block of 256
    x, y = a[7]
    assert tuple(x.shape) == spec.shape and x.dtype == torch.uint8 and 0 <= y < spec.num_classes
    assert torch.equal(x, b[7][0]) and y == b[7][1]  # sample i is the same for any size
    assert not torch.equal(a[0][0], a[1][0])
    assert not torch.equal(b[0][0], b[256][0])  # the next block is drawn afresh
    assert not torch.equal(datasets.synthetic_images(spec, 50, "test")[7][0], x)


def test_synthetic_images_are_learnable():
    """Nearest class mean (fitted on train) beats chance by far on test."""
    spec = datasets.CIFAR10
    train = datasets.synthetic_images(spec, 300, "train")
    test = datasets.synthetic_images(spec, 100, "test")
    xs, ys = train.__getitems__(list(range(len(train))))
    xt, yt = test.__getitems__(list(range(len(test))))
    xs, xt = xs.float().flatten(1), xt.float().flatten(1)
    means = torch.stack([xs[ys == c].mean(0) for c in range(10)])
    accuracy = (torch.cdist(xt, means).argmin(1) == yt).float().mean().item()
    assert accuracy > 0.5


def test_a_batch_is_its_samples_stacked_in_one_piece():
    """``__getitems__`` (what DataLoader calls with a batch's indices) is
    the samples of ``__getitem__``, stacked, in the order asked; empty too."""
    from workloads.harness.data import Batch

    for images, hwc in ((torch.randint(0, 255, (9, 5, 6, 3), dtype=torch.uint8), True),
                        (torch.randint(0, 255, (9, 5, 6), dtype=torch.uint8), False)):
        ds = datasets.StoredImages(images, list(range(9)), channels_last_storage=hwc)
        batch = ds.__getitems__([4, 0, 8])
        assert isinstance(batch, Batch) and batch.inputs.dtype == torch.uint8
        assert torch.equal(batch.inputs, torch.stack([ds[i][0] for i in (4, 0, 8)]))
        assert batch.targets.tolist() == [4, 0, 8]
        assert batch.inputs.shape[1:] == ds[0][0].shape == ((3, 5, 6) if hwc else (1, 5, 6))
        assert ds.__getitems__([]).inputs.shape == (0, *ds[0][0].shape)
    assert torch.equal(ds[2][0][0], images[2])  # N x H x W: one channel of the image


def test_the_device_pipeline_gives_the_seeds_images():
    """Seed 001 resizes each 32x32 CIFAR-10 image to 224x224 with PIL before
    ToTensor and Normalize; the pipeline upscales the uint8 batch on the
    device. The images agree to PIL's rounding: it resizes in two passes
    (rows, then columns) and rounds to uint8 after each, so a pixel may be
    up to a level (1/255, before normalisation) off, and a third of one on
    average."""
    from PIL import Image
    from torchvision import transforms

    spec = datasets.CIFAR10
    images = datasets.synthetic_images(spec, 4, "train").__getitems__([0, 1, 2, 3]).inputs
    seed = transforms.Compose([transforms.Resize(224), transforms.ToTensor(),
                               transforms.Normalize(spec.mean, spec.std)])
    theirs = torch.stack([seed(Image.fromarray(img.permute(1, 2, 0).numpy())) for img in images])
    ours = datasets.ImagePipeline(spec, 224)(images)
    assert ours.shape == theirs.shape == (4, 3, 224, 224)
    levels = (ours - theirs).abs() * torch.tensor(spec.std).view(1, 3, 1, 1) * 255
    assert levels.max() <= 1.0 and levels.mean() <= 0.33
    native = datasets.ImagePipeline(spec)(images)  # 32: no resize, ToTensor's x / 255
    expected = (images.float() / 255 - torch.tensor(spec.mean).view(1, 3, 1, 1)) \
        / torch.tensor(spec.std).view(1, 3, 1, 1)
    assert torch.equal(native, expected)
    many = torch.cat([images] * 5)  # 20 images: resized 8 at a time on the CPU
    assert torch.equal(datasets.ImagePipeline(spec, 224)(many), torch.cat([ours] * 5))
    last = datasets.ImagePipeline(spec, 64, channels_last=True)(images)
    assert last.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(last, datasets.ImagePipeline(spec, 64)(images))


def test_augmentation_crops_and_flips_each_image_on_its_own_seeded_stream():
    """Each augmented image is a 32x32 window of its own 4-pixel reflect
    padding, flipped or not (found by trying all 81 x 2); the windows
    differ between images; a seed repeats them and another does not."""
    import torch.nn.functional as F

    spec = datasets.CIFAR10
    images = datasets.synthetic_images(spec, 16, "train").__getitems__(list(range(16))).inputs
    pipe = datasets.ImagePipeline(spec, augment=True)
    pipe.seed(5, torch.device("cpu"))
    out = pipe(images)
    plain = datasets.ImagePipeline(spec)(images)
    padded = F.pad(plain, (4, 4, 4, 4), mode="reflect")
    found = []
    for k in range(16):
        found.append(next((i, j, flip) for i in range(9) for j in range(9) for flip in (0, 1)
                          if torch.allclose(out[k], (lambda w: w.flip(-1) if flip else w)(
                              padded[k, :, i:i + 32, j:j + 32]), atol=1e-6)))
    assert len(set(found)) > 8 and {f for *_, f in found} == {0, 1}
    pipe.seed(5, torch.device("cpu"))
    assert torch.equal(pipe(images), out)
    pipe.seed(6, torch.device("cpu"))
    assert not torch.equal(pipe(images), out)


def test_empty_data_dir_falls_back_to_labelled_synthetic(tmp_path):
    d = datasets.load(datasets.MNIST, str(tmp_path), "auto", train_samples=30, test_samples=10)
    assert d.data == "synthetic" and "SYNTHETIC" in d.source
    assert (len(d.train), len(d.test)) == (30, 10)


def test_data_real_without_files_is_an_error(tmp_path):
    with pytest.raises(WorkloadError, match="--data real"):
        datasets.load(datasets.CIFAR10, str(tmp_path), "real")


def test_tiny_real_datasets_load_through_torchvision(tiny_data):
    mnist = datasets.load(datasets.MNIST, tiny_data, "auto")
    assert mnist.data == "real" and (len(mnist.train), len(mnist.test)) == (48, 20)
    x, y = mnist.train[0]
    assert tuple(x.shape) == (1, 28, 28) and x.dtype == torch.uint8 and isinstance(y, int)
    cifar = datasets.load(datasets.CIFAR10, tiny_data, "real", image_size=24, train_samples=25)
    assert cifar.data == "real" and cifar.verified is False and "NOT verified" in cifar.source
    assert (len(cifar.train), len(cifar.test)) == (25, 20)
    assert tuple(cifar.train[3][0].shape) == (3, 32, 32)  # shipped at its stored size
    assert tuple(cifar.train_pipeline(cifar.train[3][0][None]).shape) == (1, 3, 24, 24)


def test_real_images_are_torchvisions_decoded_images(tiny_data):
    """What the loader ships is what torchvision's own reader decodes for
    the same index (its PIL image, as an array), channel-major."""
    import numpy as np
    from torchvision import datasets as tv

    from workloads.harness.vision import UnverifiedCIFAR10

    cifar = datasets.load(datasets.CIFAR10, tiny_data, "real").train
    theirs = UnverifiedCIFAR10(tiny_data, train=True, download=False)
    batch = cifar.__getitems__([3, 0])
    for row, index in enumerate((3, 0)):
        image, label = theirs[index]
        assert torch.equal(batch.inputs[row], torch.from_numpy(np.array(image)).permute(2, 0, 1))
        assert batch.targets[row] == label
    mnist = datasets.load(datasets.MNIST, tiny_data, "real").test
    image, label = tv.MNIST(tiny_data, train=False, download=False)[5]
    assert torch.equal(mnist[5][0][0], torch.from_numpy(np.array(image))) and mnist[5][1] == label


@pytest.mark.parametrize("subset", [0, 30])
def test_a_loader_worker_gets_real_cifar10_as_a_handle_not_a_copy(tiny_data, subset):
    """Workers restart every epoch (to reseed), and each start pickles the
    dataset into the worker: its images must travel as shared memory.
    ForkingPickler is what DataLoader's worker start uses."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 -- registers torch's shared-memory reductions

    train = datasets.load(datasets.CIFAR10, tiny_data, "real", train_samples=subset).train
    base = train.dataset if subset else train
    images = 40 * 3 * 32 * 32
    first, again = (len(bytes(ForkingPickler.dumps(train))) for _ in range(2))
    assert first < images / 4 and again == first
    received = ForkingPickler.loads(ForkingPickler.dumps(train))
    for i in (0, 7, len(train) - 1):
        assert torch.equal(received[i][0], train[i][0]) and received[i][1] == train[i][1]
    assert base.images.shared.is_shared()


def test_data_synthetic_ignores_present_files(tiny_data):
    assert datasets.load(datasets.MNIST, tiny_data, "synthetic", train_samples=8,
                         test_samples=4).data == "synthetic"


def test_incomplete_cifar_folder_is_an_error_not_a_fallback(tiny_data, tmp_path):
    import shutil

    shutil.copytree(os.path.join(tiny_data, "cifar-10-batches-py"),
                    tmp_path / "cifar-10-batches-py")
    os.unlink(tmp_path / "cifar-10-batches-py" / "data_batch_3")
    with pytest.raises(WorkloadError, match="incomplete"):
        datasets.load(datasets.CIFAR10, str(tmp_path), "auto")


def test_unverified_cifar_reads_the_genuine_pickle_layout(tiny_data):
    import pickle

    from workloads.harness.vision import UnverifiedCIFAR10

    ds = UnverifiedCIFAR10(tiny_data, train=False, download=False)
    with open(os.path.join(tiny_data, "cifar-10-batches-py", "test_batch"), "rb") as fh:
        raw = pickle.load(fh, encoding="latin1")
    assert ds.targets == raw["labels"]
    # channel-major rows -> HWC images, exactly as torchvision decodes the real files
    assert (ds.data[0][..., 0].flatten() == raw["data"][0][:1024]).all()
    assert ds.classes[0] == "airplane"


def test_seed_epoch_gives_each_rank_its_own_repeatable_worker_stream():
    """Seed 004's point: rank 0 and rank 1 must not draw the same augmentations."""
    from torch.utils.data import TensorDataset

    data = TensorDataset(torch.arange(8.0))

    def worker_base_seed(rank: int, epoch: int) -> int:
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
        ctx = read_context(env, "cpu")
        loader = hdata.train_loader(data, ctx, 2, seed=42)
        hdata.seed_epoch(loader, ctx, seed=42, epoch=epoch)
        # what DataLoader draws from the loader's generator to seed its workers
        return int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator))

    assert worker_base_seed(0, 0) != worker_base_seed(1, 0)
    assert worker_base_seed(0, 0) != worker_base_seed(0, 1)
    assert worker_base_seed(1, 3) == worker_base_seed(1, 3)


def test_the_slowest_rank_is_named_with_its_node_and_host():
    from orchestrator.records.outcome import RunOutcome, RunState
    from orchestrator.report.summary import render_summary
    from workloads.harness.evidence import straggler_report
    from workloads.harness.timing import StepTimer

    timers = []
    for rank, slow in enumerate((0.010, 0.011, 0.030)):
        timer = StepTimer()
        for step in range(20):
            timer.record(step, 0.001, slow)
        timers.append(timer)
    everyone = [{"row": {"rank": r, "node_rank": r // 2, "hostname": f"lab{r // 2}"},
                 "steps": t.rank_stats()} for r, t in enumerate(timers)]
    report = straggler_report(everyone)
    assert [r["rank"] for r in report["rank_step_times"]] == [0, 1, 2]
    assert abs(report["rank_step_times"][2]["p95_s"] - 0.031) < 1e-9
    slowest = report["slowest_rank"]
    assert (slowest["rank"], slowest["node_rank"], slowest["host"]) == (2, 1, "lab1")
    assert abs(slowest["vs_median"] - 0.031 / 0.012) < 1e-6
    outcome = RunOutcome("r", RunState.SUCCEEDED, 1.0, (), None,
                         {"world_size": 3, "metrics": {}, **report})
    # no forward times here: the mean step times, as rates (0.031 s against the
    # others' 0.011 and 0.012: 32.26 steps/s against their median, 87.12)
    assert "slowest rank: rank 2 (node 1, lab1), 31 ms/step: 32.26 steps/s, 2.7x slower " \
           "than the others' median (87.12 steps/s)" in render_summary(outcome, "/runs/r")
    # with the run's plan, the host is the cluster file's, not the machine's own name
    plan = {"nodes": [{"node_rank": 0, "host": "gpu-a"}, {"node_rank": 1, "host": "gpu-b"}]}
    assert "slowest rank: rank 2 (node 1, gpu-b), 31 ms/step" in \
        render_summary(outcome, "/runs/r", plan)


@pytest.mark.parametrize("slow_s, named", [(0.0105, False), (0.0150, False), (0.0175, True)])
def test_a_rank_is_named_slowest_only_when_it_stands_above_the_median(slow_s, named):
    """Issue #32: "slowest rank ... 1.00x the median" was printed when nothing
    was slow. The other ranks step in 11 ms; the line is the rule ``top`` and
    ``status`` use (issue #33): 1.5x of it, 16.5 ms."""
    from orchestrator.records.outcome import RunOutcome, RunState
    from orchestrator.report.summary import render_summary
    from workloads.harness.evidence import straggler_report
    from workloads.harness.timing import StepTimer

    timers = []
    for slow in (0.010, 0.010, slow_s):
        timer = StepTimer()
        for step in range(20):
            timer.record(step, 0.001, slow)
        timers.append(timer)
    everyone = [{"row": {"rank": r, "node_rank": 0, "hostname": "vm"}, "steps": t.rank_stats()}
                for r, t in enumerate(timers)]
    outcome = RunOutcome("r", RunState.SUCCEEDED, 1.0, (), None,
                         {"world_size": 3, "metrics": {}, **straggler_report(everyone)})
    assert ("slowest rank: rank 2" in render_summary(outcome, "/runs/r")) is named


def test_the_summary_names_the_rank_with_the_most_time_outside_collectives():
    """In DDP every rank's step takes as long as the slowest's (the all-reduce
    waits), so the step times name nobody; the forward passes do (issue #33:
    the rule ``top`` uses). Rank 1's forward is three times the others'."""
    from orchestrator.records.outcome import RunOutcome, RunState
    from orchestrator.report.summary import render_summary
    from workloads.harness.evidence import straggler_report
    from workloads.harness.timing import StepTimer

    timers = []
    for forward in (0.010, 0.030, 0.010):
        timer = StepTimer()
        for step in range(20):
            timer.record(step, 0.002, 0.040, forward)  # every step 42 ms: lock-step
        timers.append(timer)
    everyone = [{"row": {"rank": r, "node_rank": 0, "hostname": "vm"}, "steps": t.rank_stats()}
                for r, t in enumerate(timers)]
    report = straggler_report(everyone)
    assert report["rank_step_times"][1]["forward_mean_s"] == pytest.approx(0.030)
    outcome = RunOutcome("r", RunState.SUCCEEDED, 1.0, (), None,
                         {"world_size": 3, "metrics": {}, **report})
    assert "slowest rank: rank 1 (node 0, vm), 42 ms/step: 32 ms/step outside collectives, " \
           "2.7x the others' median (12 ms)" in render_summary(outcome, "/runs/r")


def test_pg_timeout_bounds_the_process_group_and_zero_keeps_torchs_default(monkeypatch):
    """--pg-timeout: under the hang watchdog's timeout, torch's own watchdog
    ends a collective first and dumps its flight recorder (NCCL)."""
    import datetime

    from workloads.catalog import CATALOG
    from workloads.harness import context

    assert all(info.arg("pg_timeout") is not None for info in CATALOG.values())
    asked: list[dict] = []
    monkeypatch.setattr(context.dist, "init_process_group",
                        lambda backend, **kw: asked.append(kw))
    monkeypatch.setattr(context.dist, "is_initialized", lambda: False)
    ctx = read_context({}, cuda=no_gpu)
    for seconds in (7, 0):
        with context.process_group(ctx, seconds):
            pass
    assert asked[0]["timeout"] == datetime.timedelta(seconds=7)
    assert "timeout" not in asked[1]  # torch's own default
