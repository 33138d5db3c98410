"""Which env values are secrets (``plan/secrets.py``'s one rule), and that
masking comes before every cut, so no fragment of a secret survives."""

from __future__ import annotations

import json
import os
import secrets
import signal
import time

import pytest

from conftest import every_file_holding
from keepers import keeper_specs
from test_keeper import start_all, stream, wait_ended


# A node's "torchrun" that fails with messages in which the secret straddles
# each place a record is cut: torchrun's error files (2,000 characters kept),
# the keeper's compacted records (500) and its last lines (300 each).
FAILING_PROGRAM = """
import json, os, sys
secret, log_dir = os.environ["TOKEN"], sys.argv[sys.argv.index("--log-dir") + 1]
half = len(secret) // 2
for local_rank, keep in ((0, 2000), (1, 500)):
    message = "x" * 3000 + secret + "y" * (keep - (len(secret) - half))
    where = os.path.join(log_dir, "none_x", "attempt_0", str(local_rank))
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "error.json"), "w") as fh:
        json.dump({"message": {"message": message, "extraInfo": {}}}, fh)
print("z" * 400 + secret + "w" * (300 - (len(secret) - half)), flush=True)
sys.exit(1)
"""


@pytest.mark.live  # real keepers and supervisors: seconds
def test_a_secret_that_straddles_a_cut_leaves_no_fragment_in_any_record(tmp_path):
    secret = "tok-" + secrets.token_hex(12)
    specs = keeper_specs(tmp_path, 2, env={"TOKEN": secret})
    for spec in specs:
        spec["supervisor"]["argv"][2] = FAILING_PROGRAM
    start_all(specs)
    states = wait_ended(specs)
    # Whichever node fails first stops the other, maybe before it fails too:
    # at least one node's record holds its cut failure and last lines.
    nodes = states[0]["attempts"][0]["nodes"]
    assert [n for n in nodes.values() if n["failures"] and n["last_lines"]], nodes
    fragments = (secret[:len(secret) // 2], secret[len(secret) // 2:])
    for spec in specs:
        run_dir = spec["supervisor"]["run_dir"]
        with open(os.path.join(run_dir, "keeper.json"), encoding="utf-8") as fh:
            texts = {"keeper.json": fh.read(), "agent.out": stream(spec)}
        json.loads(texts["keeper.json"])
        for name, text in texts.items():
            assert not [f for f in fragments if f in text], (name, text[-3000:])


# A node's "torchrun" whose rank prints the token into its log file, as
# torchrun's ``--redirects`` would, then trains on.
PRINTING_PROGRAM = """
import os, sys, time
log_dir = sys.argv[sys.argv.index("--log-dir") + 1]
where = os.path.join(log_dir, "none_x", "attempt_0", "0")
os.makedirs(where, exist_ok=True)
with open(os.path.join(where, "stderr.log"), "w") as fh:
    fh.write("[rank0]: logging in with " + os.environ["TOKEN"] + "\\n")
time.sleep(120)
"""


@pytest.mark.live  # real keepers, a real SIGKILL, the real guardian: seconds
def test_the_guardian_scrubs_the_logs_of_a_keeper_killed_with_sigkill(tmp_path):
    """Nothing of the keeper runs after SIGKILL; its guardian ends the ranks
    and masks the token in the logs they left."""
    secret = "tok-" + secrets.token_hex(12)
    specs = keeper_specs(tmp_path, 2, env={"TOKEN": secret})
    for spec in specs:
        spec["supervisor"]["argv"][2] = PRINTING_PROGRAM
    start_all(specs)
    deadline = time.monotonic() + 20
    while len(every_file_holding(tmp_path, secret)) < 2:  # both ranks wrote their log
        assert time.monotonic() < deadline
        time.sleep(0.1)
    for spec in specs:
        with open(os.path.join(spec["supervisor"]["run_dir"], "keeper.json")) as fh:
            os.kill(json.load(fh)["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 15  # the grace period (2 s), then the scrub
    while every_file_holding(tmp_path, secret):
        assert time.monotonic() < deadline, every_file_holding(tmp_path, secret)
        time.sleep(0.2)
