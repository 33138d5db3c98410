"""``--backend`` over a cluster file's ``backend:`` (``backends.fit``): a
backend that runs every node on this machine takes a file only when every
node in it is this machine; one remote node among local ones is enough to
refuse it, since that node's ranks would otherwise run here."""

from __future__ import annotations

import pytest

from orchestrator.backends import fit
from orchestrator.config.loader import load_cluster_text
from orchestrator.engine.options import LaunchOptions
from orchestrator.errors import ConfigError


def cluster(*hosts: str) -> str:
    nodes = "".join(f"  - {{host: {h}, procs: 1}}\n" for h in hosts)
    return f"backend: ssh\nnodes:\n{nodes}master: {{addr: 10.0.0.1}}\nworkload:\n  name: linear\n"


@pytest.mark.parametrize("hosts", [("localhost", "b"), ("b", "localhost"), ("a", "b")])
def test_backend_local_over_a_file_with_any_remote_node_is_refused(hosts):
    spec = load_cluster_text(cluster(*hosts))
    with pytest.raises(ConfigError) as raised:
        fit(spec, LaunchOptions(), "local")
    assert raised.value.path == "--backend" and raised.value.source == "command line"
    assert "runs every node on this machine, but the file lists remote hosts" in \
        raised.value.message
    assert "--local" in raised.value.hint


def test_backend_local_over_a_file_of_local_nodes_runs_them_here():
    spec = load_cluster_text(cluster("localhost", "localhost"))
    assert spec.backend == "ssh"
    assert fit(spec, LaunchOptions(), "local").backend == "local"
    assert fit(spec, LaunchOptions()).backend == "ssh"  # no --backend: the file's
