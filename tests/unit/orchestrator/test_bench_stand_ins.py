"""A bench's stand-in must answer what the agent asks today: the multinode
bench's printf ``nvidia-smi`` once gave 9 of the 14 fields the agent reads,
and every ``gpus: free:1`` launch of the bench was refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

PROBE = """
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import pathlib, tempfile
from multinode_launch import stand_in_smi
from orchestrator.agent.node import gpus
os.environ["PATH"] = stand_in_smi(pathlib.Path(tempfile.mkdtemp())) + ":" + os.environ["PATH"]
print(json.dumps(gpus.facts()))
"""


def test_the_multinode_benchs_nvidia_smi_gives_one_fit_gpu_per_host():
    out = subprocess.run([sys.executable, "-c", PROBE, ROOT], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT,
                              "SSH_CONNECTION": "127.0.0.9 50000 127.0.55.10 22"},
                         timeout=60, check=True).stdout
    facts = json.loads(out.splitlines()[-1])
    assert facts["ok"] and "notes" not in facts and "unreported" not in facts, facts
    (gpu,) = facts["gpus"]
    assert gpu["uuid"] == "GPU-bench-127.0.55.10" and gpu["fault"] is None
    from orchestrator.agent.node.gpus import choose

    assert choose([0], facts["gpus"], facts["apps"])["ok"]
