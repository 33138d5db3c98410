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


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> str:
    """A data dir holding a tiny MNIST (idx files) and CIFAR-10 (pickle batches)."""
    root = tmp_path_factory.mktemp("tiny-data")
    write_mnist(str(root), train=48, test=20)
    write_cifar10(str(root), train=40, test=20)
    return str(root)
