"""The user docs' numbers (README.md and docs/) at their boundary, driven
through the code that enforces them: one byte over a cap is refused and the
cap itself is not (sparse files, so a GiB costs nothing), a count one over,
a secret one character short; a long time by a fake clock or by following
the default from the command line to the code that waits. The oracles are
the docs' literal numbers, never the code's constants;
``unit/cli/test_docs.py`` (``test_every_number_the_readme_promises_is_the_codes``)
ties each docs phrase to the constant or default, so these need only its
literal."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from orchestrator.agent.gangrule import Clock, NodeView, Stop, Timeouts, judge
from orchestrator.agent.kept import keeper, peers
from orchestrator.agent.node import outputs
from orchestrator.agent.wire import files
from orchestrator.agent.wire.owner import Owner
from orchestrator.agent.wire.protocol import PEER_TIMEOUT_S
from orchestrator.backends import choose
from orchestrator.controller import session
from orchestrator.engine.options import LaunchOptions
from orchestrator.cli.main import main as cli
from orchestrator.config.loader import load_cluster_text
from orchestrator.engine import checknet, gang, gpuplan
from orchestrator.engine.bundle import scan_script_dir
from orchestrator.engine.nodespec import supervisor_spec
from orchestrator.engine.results import fetch_outputs, wanted_files
from orchestrator.errors import ConfigError
from orchestrator.plan.secrets import MASK, is_secret, mask_env
from orchestrator.records.rundir import RunDir

MiB, GiB = 1 << 20, 1 << 30
NODES = "nodes: [{host: a, procs: 1}, {host: b, procs: 2}]\nworkload: {name: linear}\n"


def sparse(path, size: int):
    """A file of ``size`` bytes that takes no disk (and no time) to make."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def dryrun_of(extra: str = "", options: LaunchOptions | None = None):
    spec = load_cluster_text(NODES + textwrap.dedent(extra), source="c.yaml")
    backend = choose(spec, options or LaunchOptions())
    return backend.dryrun(backend.plan("r1", "/tmp/runs/r1"))


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# -- sizes and counts ------------------------------------------------------------


def test_the_upload_cap_is_64_mib_to_the_byte(tmp_path):
    project = tmp_path / "project"
    data = sparse(str(project / "data.bin"), 64 * MiB)
    scan_script_dir(str(project)).check_size()  # at the cap: uploaded
    sparse(data, 64 * MiB + 1)
    with pytest.raises(ConfigError) as caught:
        scan_script_dir(str(project)).check_size()
    assert f"({64 * MiB + 1} bytes)" in str(caught.value)
    assert f"64.0 MiB cap ({64 * MiB} bytes)" in str(caught.value)


def test_rank_0s_result_comes_home_up_to_16_mib(tmp_path):
    (result,) = wanted_files(dryrun_of(), SimpleNamespace(nodes=[]))[0]
    assert result.local == "result.json"
    path = sparse(str(tmp_path / "result.json"), 16 * MiB)
    assert len(files.get(path, result.limit)) == 16 * MiB  # the agent's get, and Slurm's read
    sparse(path, 16 * MiB + 1)
    with pytest.raises(files.TransferError, match=f"{16 * MiB + 1} bytes, more than the "
                                                  f"{16 * MiB} accepted"):
        files.get(path, result.limit)


def _outputs(tmp_path, listing=None, fetched=b"x"):
    """``fetch_outputs`` of ``out/`` against node 0's real ``collect`` over
    ``tmp_path/root`` (or ``listing``), each file fetched as ``fetched``;
    returns (record, the limits asked of get)."""
    info = dryrun_of("outputs: [out/]\n")
    run = RunDir(str(tmp_path / "run"))
    os.makedirs(run.path)
    tree = str(tmp_path / "root")
    asked = []

    def get(path, limit):
        asked.append(limit)
        return fetched

    record = fetch_outputs(info, run, listing or (
        lambda root, **request: outputs.collect(tree, **request)), get)
    return record, asked


def test_an_output_file_may_have_256_mib_and_all_of_them_1_gib(tmp_path):
    for name in ("a", "b", "c", "d"):  # 4 x 256 MiB: 1 GiB exactly
        sparse(str(tmp_path / "root" / "out" / name), 256 * MiB)
    sparse(str(tmp_path / "root" / "out" / "e"), 256 * MiB + 1)  # one byte too many
    sparse(str(tmp_path / "root" / "out" / "z"), 1)  # over the total by one byte
    record, asked = _outputs(tmp_path)
    assert [f["path"] for f in record["files"]] == ["out/a", "out/b", "out/c", "out/d"]
    assert {r["path"]: r["why"] for r in record["refused"]} == {
        "out/e": f"{256 * MiB + 1} bytes, more than the {256 * MiB} a file may have",
        "out/z": f"over the {GiB} bytes all outputs may have together"}
    assert asked == [256 * MiB] * 4  # and each fetch is capped at 256 MiB too


def test_at_most_1000_output_files_come_home(tmp_path, monkeypatch):
    os.makedirs(tmp_path / "root" / "out")
    # 1001 empty regular files under out/, as node 0's walk finds them (a
    # thousand real files take seconds to make on a loaded disk)
    monkeypatch.setattr(outputs, "_walk", lambda directory, rel: (
        (f"{rel}/f{i:04}", 0, "") for i in range(1001)))
    found = outputs.collect(str(tmp_path / "root"), ["out/"], 1, 1)  # the 1001st refused
    assert len(found["files"]) == 1000
    assert found["refused"] == [{"path": "out/f1000", "why": "more than 1000 files"}]
    listing = {"ok": True, "files": [{"path": f"out/f{i:04}", "size": 0} for i in range(1001)]}
    _, asked = _outputs(tmp_path, lambda **request: listing, fetched=None)
    assert len(asked) == 1000  # and the controller asks for no more, whatever node 0 says


@pytest.mark.parametrize("value, secret", [("abcdefg", False), ("abcdefgh", True)])
def test_a_secret_has_at_least_8_characters(value, secret):
    assert is_secret("HF_TOKEN", value) is secret
    assert (mask_env({"HF_TOKEN": value})["HF_TOKEN"] == MASK) is secret


def test_at_most_16_connections_wait_for_their_hello(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(peers.time, "monotonic", lambda: clock.sleep(0.001) or clock.now)
    listener = socket.create_server(("127.0.0.1", 0))
    gate = peers.Gate(listener, "token", 2, lambda *a: None)  # not started: driven by hand
    clients = [socket.create_connection(listener.getsockname()) for _ in range(17)]
    try:
        for _ in range(16):
            gate._accept()
        first = list(gate.pending)
        assert len(first) == 16 and all(conn.fileno() >= 0 for conn in first)
        gate._accept()  # the 17th: the oldest gives way
        assert len(gate.pending) == 16
        assert first[0].fileno() == -1 and first[0] not in gate.pending
        assert all(conn in gate.pending for conn in first[1:])
    finally:
        for conn in [*gate.pending, *clients, listener, gate._wake_r, gate._wake_w]:
            conn.close()


# -- times: the default reaches what waits -----------------------------------------


def test_up_defaults_reach_the_run_grace_10s_start_timeout_300s(monkeypatch, tmp_path):
    seen = []

    def launch(backend, info, *, runs_dir, console):
        seen.append(backend.options)
        raise SystemExit(0)

    monkeypatch.setattr(session, "launch", launch)
    result = CliRunner().invoke(cli, [
        "up", "--local", "--workload", "linear", "--procs", "2", "--runs-dir", str(tmp_path)],
        prog_name="ddp-orch")
    assert result.exit_code == 0, result.output
    (options,) = seen
    assert (options.grace_s, options.start_timeout_s, options.hang_timeout_s) == (10, 300, None)
    info = dryrun_of(options=options)
    spec = supervisor_spec(info.nodes[1], "r1", 29500, options.grace_s)
    # each node: SIGTERM, 10 s, SIGKILL; a heartbeat every 5 s; 30 s of silence
    assert (spec.grace_s, spec.heartbeat_s, spec.owner.pings, PEER_TIMEOUT_S) == (10, 5, True, 30)
    timeouts = Timeouts(options.start_timeout_s, PEER_TIMEOUT_S)
    waiting = [NodeView(0, "node 0", joined=True, started=True), NodeView(1, "node 1")]
    assert judge(waiting, timeouts, Clock(0.0), 300.0) is None
    verdict = judge(waiting, timeouts, Clock(0.0), 300.001)
    assert verdict.stop is Stop.START_TIMEOUT and "within 300s" in verdict.why
    silent = [NodeView(0, "node 0", heard_s=1.0), NodeView(1, "node 1", heard_s=30.0)]
    assert judge(silent, timeouts, Clock(0.0), 1.0) is None
    silent[1] = NodeView(1, "node 1", heard_s=30.001)
    assert judge(silent, timeouts, Clock(0.0), 1.0).why == "node 1 silent for 30s"


def test_check_gives_each_step_60s_and_each_data_path_connection_5s(monkeypatch, tmp_path):
    seen = []

    def chosen(spec, options, backend=None):
        seen.append(options)
        raise SystemExit(0)

    monkeypatch.setattr(sys.modules["orchestrator.backends"], "choose", chosen)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(NODES)
    result = CliRunner().invoke(cli, ["check", str(cluster)], prog_name="ddp-orch")
    assert result.exit_code == 0, result.output
    assert seen[0].check_timeout_s == 60

    from orchestrator.engine import checknet
    monkeypatch.setattr(checknet, "master_port", lambda plan, agent: 29555)
    calls = []

    class Agent:
        def call(self, op, **fields):
            calls.append((op, fields))
            if op == "listen":
                return {"ok": True}
            return {"results": [{"ok": True} for _ in fields["targets"]]}

    plan = dryrun_of().plan
    nets = {k: SimpleNamespace(endpoint=(f"10.0.0.{k + 1}", 40000 + k)) for k in (0, 1)}
    rows = checknet.master_rows(plan, {0: Agent(), 1: Agent()}, nets, seen[0].check_timeout_s)
    assert rows[-1].check == "data-path" and rows[-1].ok
    assert [f["timeout"] for op, f in calls if op == "connect"] == [5, 5]


def test_the_setup_timeout_is_1800s_unless_the_file_says(tmp_path):
    info = dryrun_of("setup: [make]\n")
    assert info.plan.setup_timeout_s == 1800
    spec = supervisor_spec(info.nodes[0], "r1", 29500, 10.0)
    assert spec.setup["timeout_s"] == 1800  # what the node's setup runs under


def test_a_hang_timeout_is_at_least_10s():
    with pytest.raises(ConfigError, match="hang_timeout"):
        load_cluster_text(NODES + "hang_timeout: 9\n", source="c.yaml")
    assert load_cluster_text(NODES + "hang_timeout: 10\n", source="c.yaml").hang_timeout == 10
    assert load_cluster_text(NODES, source="c.yaml").hang_timeout is None  # default off


def test_clocks_warn_beyond_2s():
    hosts = {0: "a", 1: "b"}
    (row,) = checknet.clock_rows({0: (0.0, 0.0), 1: (2.0, 0.0)}, hosts)
    assert not row.warning and row.detail.startswith("clocks within 2s of each other")
    (row,) = checknet.clock_rows({0: (0.0, 0.0), 1: (2.01, 0.0)}, hosts)
    assert row.warning and "(more than 2s;" in row.detail


def test_a_gpu_wait_says_every_30s_who_holds_them(monkeypatch):
    clock = FakeClock(0.0)
    monkeypatch.setattr(gpuplan.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(gpuplan.time, "sleep", clock.sleep)
    held = {"ok": False, "waitable": True, "error": "GPU 3 is held"}
    said = []
    assert gpuplan.wait_for_gpus(held, lambda: held, 100, said.append, "node 0") is held
    assert [line.split("up to ")[1].split(" more")[0] for line in said] == \
        ["1m40s", "1m10s", "40s", "10s"]


def test_the_survivors_of_an_attempt_are_awaited_30s(monkeypatch):
    clock = FakeClock(0.0)
    monkeypatch.setattr(keeper.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(keeper.time, "sleep", clock.sleep)
    said = []
    me = SimpleNamespace(say=said.append, final="")

    def attempt(gone_at: float) -> dict:
        clock.now = 0.0
        monkeypatch.setattr(keeper, "_still_there", lambda s: clock.now < gone_at)
        sup = SimpleNamespace(last_exit={"survivors": [{"pid": 4242}]})
        keeper.Keeper._await_survivors(me, sup)
        return sup.last_exit

    assert attempt(gone_at=29.8).get("survivors_gone") is True
    last = attempt(gone_at=1e9)  # never gone: given up on after 30 s
    assert last["survivors"] == [{"pid": 4242}] and not last.get("survivors_gone")
    assert 30 <= clock.now < 30.3
    assert said[0].endswith("would not die; waiting up to 30s for them to go")


def test_quiet_shows_a_progress_line_per_node_every_15s(monkeypatch):
    clock = FakeClock(1000.0)
    monkeypatch.setattr(gang.time, "monotonic", clock.monotonic)
    lines = []
    handle = SimpleNamespace(progress={0: (7, 1000.0)}, samples={}, pace={}, step_at={}, output_at={}, started=True,
                             gpu_use=SimpleNamespace(now={}),
                             node=SimpleNamespace(ranks=[0], node_rank=0, host="a"))
    me = SimpleNamespace(_progress_written=1000.0, _progress_shown=1000.0, handles=[handle],
                         leaves=False, owner=Owner(),
                         plan=SimpleNamespace(ranks=[SimpleNamespace(rank=0, gpu=None)]),
                         run_dir=SimpleNamespace(write_progress=lambda record: None),
                         console=SimpleNamespace(view="quiet", always=lines.append))
    for now, shown in ((1014.9, 0), (1015.0, 1), (1029.9, 1), (1030.0, 2)):
        clock.now = now
        me._progress_written = 0.0  # progress.json's own pace (every 2 s) aside
        gang.Gang._report_progress(me)
        assert len(lines) == shown, (now, lines)
    assert lines[0].startswith("ddp-orch: node 0 (a): 1 rank(s) at step 7, last progress")


def test_a_step_heartbeat_writes_at_most_once_a_second(monkeypatch, tmp_path):
    from workloads import contract

    clock = FakeClock(1000.0)
    monkeypatch.setattr("time.monotonic", clock.monotonic)
    monkeypatch.setattr(contract, "_last_heartbeat", [0.0])
    monkeypatch.setenv(contract.RESULT_FILE_ENV, str(tmp_path / "result.json"))
    monkeypatch.setenv("RANK", "0")
    path = tmp_path / contract.PROGRESS_DIR / "rank-0"
    for now, step, written in ((1000.0, 1, 1), (1000.999, 2, 1), (1001.0, 3, 3)):
        clock.now = now
        contract.heartbeat(step)
        assert path.read_text().split()[0] == str(written)
