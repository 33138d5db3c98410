"""Fixtures for the workload tests (helpers live in wl_support.py)."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from workloads.make_tiny_datasets import write_cifar10, write_mnist  # noqa: E402

NO_GPU = "no CUDA GPU here (torch.cuda.is_available() is False)"


@pytest.hookimpl(tryfirst=True)  # before skipif: the missing GPU is the reason to show
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip ``gpu`` tests where torch sees no GPU, saying so, so that one
    pytest command serves CPU-only CI and a GPU host alike. torch is imported
    only when a gpu test is about to run."""
    if item.get_closest_marker("gpu") is None:
        return
    import torch

    if not torch.cuda.is_available():
        pytest.skip(NO_GPU)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> str:
    """A data dir holding a tiny MNIST (idx files) and CIFAR-10 (pickle batches)."""
    root = tmp_path_factory.mktemp("tiny-data")
    write_mnist(str(root), train=48, test=20)
    write_cifar10(str(root), train=40, test=20)
    return str(root)
