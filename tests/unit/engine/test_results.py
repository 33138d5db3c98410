"""Which paths a node's report may name for the controller to fetch
(``engine/results.inside``): only those inside the node's run directory,
never a sibling whose name merely starts the same (``node-1`` / ``node-10``)."""

from __future__ import annotations

import pytest

from orchestrator.engine.results import inside


@pytest.mark.parametrize("directory, name, expected", [
    ("/r/node-1", "err.json", "/r/node-1/err.json"),
    ("/r/node-1/", "torchrun/0/error.json", "/r/node-1/torchrun/0/error.json"),
    ("/r/node-1", "a/../b.json", "/r/node-1/b.json"),
    # siblings that share the directory's name as a prefix
    ("/r/node-1", "../node-10/err.json", None),
    ("/r/node-1", "/r/node-10/err.json", None),
    ("/r/node-1", "/r/node-1x", None),
    ("/r/node-1", "../node-1.old/err.json", None),
    ("/r/node-1/", "../node-12/torchrun/0/error.json", None),
    ("~/.ddp-orch/runs/r/node-1", "../node-10/err.json", None),
    ("~/.ddp-orch/runs/r/node-1", "torchrun/err.json", "~/.ddp-orch/runs/r/node-1/torchrun/err.json"),
    # the directory itself, its parent, elsewhere
    ("/r/node-1", ".", None),
    ("/r/node-1", "..", None),
    ("/r/node-1", "/etc/passwd", None),
    ("/r/node-1", "", None),
    ("/r/node-1", None, None),
])
def test_only_paths_inside_the_directory_are_fetched(directory, name, expected):
    assert inside(directory, name) == expected
