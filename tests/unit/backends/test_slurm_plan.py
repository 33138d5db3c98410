"""The Slurm backend without a Slurm: the cluster file, the dry-run, the job files
and the agent's job mode (unit tests; the live ones are test_slurm_launch.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from orchestrator.agent.wire import bootstrap
from orchestrator.agent.node.jobfile import JobSpec
from orchestrator.agent.wire.owner import Holder, Owner
from orchestrator.agent.node.jobnode import (JobNodeError, node_rank_here,
                                        node_spec, secret_variable)
from orchestrator.backends.slurm import ctl as slurmctl
from orchestrator.engine.options import LaunchOptions
from orchestrator.backends.slurm.backend import PLACEMENT, Backend
from orchestrator.backends.slurm.check import shared_dir_problem
from orchestrator.config.loader import load_cluster_text
from orchestrator.errors import ConfigError

GOLDEN = os.path.join(ROOT, "tests", "golden")


def load(text: str):
    return load_cluster_text(text, source="c.yaml")


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value


def test_dry_run_of_a_slurm_file_matches_golden_word_for_word():
    # --runs-dir as given: the golden holds no path of this machine's (without
    # it, the runs directory is found from here, or is the user's default)
    result = run_cli("up", "tests/golden/slurm.yaml", "--dry-run", "--run-id", "slurm-golden",
                     "--runs-dir", "runs")
    assert result.returncode == 0, result.stderr
    with open(os.path.join(GOLDEN, "slurm.text.txt"), encoding="utf-8") as fh:
        assert result.stdout == fh.read()


def test_json_dry_run_keeps_the_seed_layout_and_shows_the_batch_script():
    plan = json.loads(run_cli("up", "tests/golden/slurm.yaml", "--dry-run", "--format",
                              "json").stdout)
    assert plan["backend"] == "slurm" and plan["world_size"] == 7
    assert [n["ranks"] for n in plan["nodes"]] == [[0, 2], [3, 6]]
    assert [n["env"]["CUDA_VISIBLE_DEVICES"] for n in plan["nodes"]] == ["3,4,5", "0,1,2,3"]
    assert [n["host"] for n in plan["nodes"]] == ["node1", "node2"]
    script = next(v for k, v in plan["extras"].items() if k.startswith("batch script"))
    assert "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1" in script
    assert "not-a-real-key" not in json.dumps(plan)


def test_slurm_block_and_count_mode_are_read():
    spec = load("slurm: {partition: gpu, qos: high, time: 90, extra: ['--exclusive', "
                "'--constraint=a100']}\nnodes: {count: 4, gpus: 8}\nworkload: {name: noop}\n")
    assert spec.backend == "slurm" and spec.placed
    assert spec.block("slurm").partition == "gpu" and spec.block("slurm").time == "90"
    assert spec.block("slurm").extra == ("--exclusive", "--constraint=a100")
    assert spec.world_size == 32 and [n.nproc for n in spec.nodes] == [8] * 4
    backend = Backend(LaunchOptions(), spec)
    plan = backend.plan("r", "/shared/runs/r")
    argv = backend.sbatch_argv(plan)
    assert "--nodes=4" in argv and "--gres=gpu:8" in argv and "--qos=high" in argv
    assert not any(a.startswith("--nodelist") for a in argv)
    assert all("CUDA_VISIBLE_DEVICES" not in n.env for n in plan.nodes)  # Slurm's GRES sets it
    assert [n.run_dir for n in plan.nodes] == [f"/shared/runs/r/node-{k}" for k in range(4)]


def test_cpu_processes_ask_for_cpus_and_pinned_gpus_for_enough_gres():
    cpu = load("backend: slurm\nnodes: [{host: a, procs: 3}, {host: b, procs: 5}]\n"
               "workload: {name: noop}\n")
    argv = Backend(LaunchOptions(), cpu).sbatch_argv(Backend(LaunchOptions(), cpu).plan("r", "/s"))
    assert "--cpus-per-task=5" in argv and "--nodelist=a,b" in argv
    assert not any(a.startswith("--gres") for a in argv)
    gpu = load("backend: slurm\nnodes: [{host: a, gpus: '3,4,5'}, {host: b, gpus: 1}]\n"
               "workload: {name: noop}\n")
    backend = Backend(LaunchOptions(), gpu)
    assert "--gres=gpu:6" in backend.sbatch_argv(backend.plan("r", "/s"))


@pytest.mark.parametrize("text, where, needle", [
    ("nodes: {count: 0, procs: 1}\n", "c.yaml:1: nodes.count", "0 is out of range 1-4096"),
    ("slurm: {extra: [exclusive]}\nnodes: {count: 1, procs: 1}\n", "c.yaml:1: slurm.extra[0]",
     "not an sbatch option"),
    ("slurm: {extra: ['--nodes=3']}\nnodes: {count: 1, procs: 1}\n", "slurm.extra[0]",
     "--nodes is set by ddp-orch"),
    ("slurm: {extra: ['--partition=x']}\nnodes: {count: 1, procs: 1}\n", "slurm.extra[0]",
     "use `slurm: {partition: ...}`"),
    ("slurm: {partiton: gpu}\nnodes: {count: 1, procs: 1}\n", "slurm.partiton",
     "did you mean 'partition'"),
    ("slurm: {time: four hours}\nnodes: {count: 1, procs: 1}\n", "slurm.time",
     "not a Slurm time limit"),
    ("backend: slurm\nssh: {user: me}\nnodes: [{host: a, procs: 1}]\n", "c.yaml:2: ssh",
     "do not apply to backend: slurm"),
    ("backend: slurm\nnodes: [{host: a, procs: 1, ssh: {port: 2}}]\n", "nodes[0].ssh",
     "do not apply to backend: slurm"),
    ("backend: ssh\nslurm: {partition: gpu}\nnodes: [{host: a, procs: 1}]\n", "c.yaml:2: slurm",
     "need backend: slurm"),
    ("backend: ssh\nnodes: {count: 2, procs: 1}\n", "nodes", "need backend: slurm"),
    ("backend: slurm\nnodes: [{host: a, gpus: 0}, {host: a, gpus: 1}]\n", "nodes[1].host",
     "list a Slurm node once"),
    ("backend: slurm\nnodes: [{host: localhost, procs: 1}]\n", "nodes[0].host",
     "a Slurm node name, not localhost"),
    ("nodes: {count: 2, gpus: 1, procs: 1}\n", "nodes", "exactly one of 'gpus' or 'procs'"),
    ("slurm: {time: 12:00:00}\nnodes: {count: 1, procs: 1}\n", "slurm.time",
     "was read as the number 43200"),
    ("slurm: {extra: ['--out=/tmp/x']}\nnodes: {count: 1, procs: 1}\n", "slurm.extra[0]",
     "--out (--output) is set by ddp-orch"),
    ("slurm: {extra: ['--requeue']}\nnodes: {count: 1, procs: 1}\n", "slurm.extra[0]",
     "--requeue is set by ddp-orch"),
    ("backend: slurm\nnodes: [{host: a, procs: 1, python: /x/python}]\n", "nodes[0].python",
     "one python runs the whole job"),
])
def test_slurm_mistakes_name_the_field_and_the_fix(text, where, needle):
    error = error_of(text + "workload: {name: noop}\n")
    assert where in str(error) and needle in str(error), str(error)


def test_the_job_files_hold_no_secret_and_sbatch_carries_it(tmp_path, monkeypatch):
    from orchestrator.controller.session import prepare
    from orchestrator.records.rundir import RunDir

    spec = load("backend: slurm\nenv: {HF_TOKEN: hf-s3cret-value, PLAIN: x, "
                "TOKENIZERS_PARALLELISM: 'false', CACHE_KEY: abc}\n"
                "nodes: [{host: a, procs: 1}, {host: b, procs: 1}]\nworkload: {name: noop}\n")
    run = RunDir.create(str(tmp_path), "r")
    backend, info = prepare(spec, LaunchOptions(), run_id="r", local_run_dir=run.path)
    env = backend.write_job(info, run)
    assert env[secret_variable(1, "HF_TOKEN")] == "hf-s3cret-value"
    for name in os.listdir(run.path):
        path = os.path.join(run.path, name)
        if os.path.isfile(path) and not name.endswith((".gz", ".pyz")):
            with open(path, encoding="utf-8") as fh:
                assert "hf-s3cret-value" not in fh.read(), name
    job = json.loads(open(run.file("job.json")).read())
    # The one rule (plan/secrets.py), as on the SSH path: settings and short
    # values are no secrets, so the node agent masks exactly what SSH nodes do.
    assert job["nodes"][0]["secret_env"] == ["HF_TOKEN"]
    node_env = job["nodes"][0]["spec"]["env"]
    assert (node_env["PLAIN"], node_env["TOKENIZERS_PARALLELISM"], node_env["CACHE_KEY"]) \
        == ("x", "false", "abc")


def test_extra_options_that_only_look_like_ours_pass():
    spec = load("slurm: {extra: ['--mem=0', '--gres-flags=enforce-binding', '--exclusive']}\n"
                "nodes: {count: 1, procs: 1}\nworkload: {name: noop}\n")
    assert spec.block("slurm").extra == ("--mem=0", "--gres-flags=enforce-binding", "--exclusive")


def test_a_step_asks_for_the_cpus_of_a_cpu_job_and_the_job_is_never_requeued():
    spec = load("nodes: {count: 2, procs: 3}\nworkload: {name: noop}\n")
    backend = Backend(LaunchOptions(), spec)
    plan = backend.plan("r", "/s/r")
    assert "--no-requeue" in backend.sbatch_argv(plan)
    assert "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=3 " in backend.batch_script(plan)


def test_error_files_named_by_a_node_must_be_inside_its_run_directory(tmp_path):
    from orchestrator.engine.results import inside as _inside

    (tmp_path / "node-0" / "torchrun").mkdir(parents=True)
    (tmp_path / "node-0" / "torchrun" / "error.json").write_text("{}")
    assert _inside(str(tmp_path / "node-0"), "torchrun/error.json") == \
        str(tmp_path / "node-0" / "torchrun" / "error.json")
    for hostile in ("/etc/passwd", "../../etc/passwd", "", None, 7):
        assert _inside(str(tmp_path / "node-0"), hostile) is None


def test_a_stream_reads_what_arrives_after_the_job_ended_and_stops_when_closed(tmp_path,
                                                                                monkeypatch):
    import threading

    from orchestrator.backends.scheduler import job as slurmjob

    monkeypatch.setattr(slurmjob, "SETTLE_S", 0.5)
    job = slurmjob.Job("1", Backend(LaunchOptions()), poll=False)
    job.gone = True  # Slurm has forgotten it: the job is over
    path = tmp_path / "agent.out"
    stream = slurmjob.JobStream(str(path), job, "n1")
    threading.Timer(0.2, lambda: path.write_bytes(b"late line\n")).start()
    assert stream.read_chunk(100) == b"late line\n"  # shown late, as over NFS
    assert stream.read_chunk(100) == b""  # then nothing for SETTLE_S: the end
    live = slurmjob.Job("2", Backend(LaunchOptions()), poll=False)  # not ended: would wait for ever
    waiting = slurmjob.JobStream(str(tmp_path / "none.out"), live, "n2")
    threading.Timer(0.2, waiting.close).start()
    assert waiting.read_chunk(100) == b""


def test_a_cancel_that_fails_is_not_counted_as_sent(monkeypatch):
    from orchestrator.backends.scheduler import job as slurmjob

    calls = []

    def cancel(job_id, signal=None):
        calls.append(signal)
        if len(calls) == 1:
            raise slurmctl.SlurmError("scancel", "slurmctld is busy")

    monkeypatch.setattr(slurmctl, "cancel", cancel)
    job = slurmjob.Job("3", Backend(LaunchOptions()), poll=False)
    with pytest.raises(slurmctl.SlurmError):
        job.cancel()
    job.cancel()
    job.cancel()  # sent once already: not again
    assert calls == [None, None]


def test_pinned_gpus_outside_slurms_allocation_are_refused():
    from orchestrator.agent.node.jobnode import check_gpus

    check_gpus("3,4,5", "0,1,2,3,4,5", PLACEMENT)
    check_gpus("3,4,5", None, PLACEMENT)  # no GRES on record: nothing to compare with
    with pytest.raises(JobNodeError, match=r"GPU 5 is not among the GPUs Slurm allocated to "
                                           r"this job here \(0,1,2,3,4,6\); another job may "
                                           r"hold it. Ask for the node whole \(slurm: "):
        check_gpus("3,4,5", "0,1,2,3,4,6", PLACEMENT)


def _job_file(placed: bool = False) -> dict:
    """A job file as the backend writes it (``JobSpec.to_dict``)."""
    spec = {"run_id": "r", "node_rank": 0,
            "argv": ["python3", "--master-addr", "<slurm node 0>", "--master-port",
                     "<free port on slurm node 0>",
                     "--device", "auto", "<slurm node 0>x"],
            "env": {"A": "1"}, "unset_env": ["TORCH_ELASTIC_WORKER_IDENTICAL"], "run_dir": "/r",
            "owner": {"holder": "scheduler", "detached": False}}
    return {"run_id": "r", "job_dir": "/r", "placed": placed,
            "placement": dataclasses.asdict(PLACEMENT), "master_addr": None, "master_port": None,
            "start_timeout_s": 300, "nodes": [{"host": "n1", "spec": spec, "secret_env": []},
                                              {"host": "n2", "spec": dict(spec),
                                               "secret_env": ["K"]}]}


def _job(placed: bool = False) -> JobSpec:
    return JobSpec.from_dict(_job_file(placed))


def test_the_job_file_is_read_back_as_written_and_a_bad_one_is_refused_by_field():
    from orchestrator.agent.node.spec import SpecError

    job = _job()
    assert JobSpec.from_dict(json.loads(json.dumps(job.to_dict()))) == job
    assert job.placement == PLACEMENT and job.nodes[1].secret_env == ("K",)
    for change, named in [({"placed": 1}, "'placed'"), ({"master_port": 0}, "'master_port'"),
                          ({"start_timeout_s": "5"}, "'start_timeout_s'"),
                          ({"nodes": []}, "'nodes'"),
                          ({"placement": {"scheduler": "Slurm"}}, "'placement'"),
                          ({"nodes": [{"host": "n1", "spec": {}}]}, "bad supervisor spec"),
                          ({"nodes": [{"host": "n1", "spec": {**_job_file()["nodes"][0]["spec"],
                                                             "owner": Owner().to_json()}}]},
                           "the run's owner is controller, not the scheduler")]:
        with pytest.raises(SpecError, match="^bad ") as refused:
            JobSpec.from_dict({**_job_file(), **change})
        assert named in str(refused.value)


def test_a_node_finds_its_entry_by_slurm_name_or_allocation_index():
    assert node_rank_here(_job(), {"SLURMD_NODENAME": "n2"}) == 1
    assert node_rank_here(_job(placed=True), {"SLURM_NODEID": "0"}) == 0
    with pytest.raises(JobNodeError, match="Slurm node 'n9', which is not in the plan"):
        node_rank_here(_job(), {"SLURMD_NODENAME": "n9"})
    with pytest.raises(JobNodeError, match="not a node of this 2-node job"):
        node_rank_here(_job(placed=True), {"SLURM_NODEID": "2"})


def test_the_master_slots_are_replaced_word_for_word_and_secrets_come_from_sbatch():
    with pytest.raises(JobNodeError, match="K did not reach the job"):
        node_spec(_job(), 1, {"addr": "host0", "port": 1}, {})
    environ = {secret_variable(1, "K"): "v4lue", "DDP_ORCH_SECRET_0_OTHER": "z"}
    spec = node_spec(_job(), 1, {"addr": "host0", "port": 12345}, environ)
    assert spec.argv == ("python3", "--master-addr", "host0", "--master-port", "12345",
                         "--device", "auto", "<slurm node 0>x")
    assert spec.master_port == 12345 and spec.env["K"] == "v4lue"
    assert spec.secrets == ("v4lue",)
    assert set(environ) <= set(spec.unset_env)  # not passed on to the workers
    assert spec.owner == Owner(Holder.SCHEDULER) and not spec.owner.pings


def test_a_python_under_home_is_the_nodes_own_under_slurm():
    """``python: ~/venv/bin/python``: no controller asks a Slurm node for its
    home, so the node fills it in, in torchrun's program word and setup's
    PATH; a ``~/`` among the program's own arguments is left as it is."""
    job = _job_file()
    spec = job["nodes"][0]["spec"]
    spec["argv"] = ["~/venv/bin/python", "-m", "torch.distributed.run", "--data", "~/d"]
    spec["setup"] = {"commands": [["pip", "install", "x"]], "cwd": "/r/project",
                     "timeout_s": 60.0, "path_first": "~/venv/bin"}
    here = node_spec(JobSpec.from_dict(job), 0, {"addr": "host0", "port": 1}, {"HOME": "/home/u"})
    assert here.argv == ("/home/u/venv/bin/python", "-m", "torch.distributed.run", "--data",
                         "~/d")
    assert here.setup["path_first"] == "/home/u/venv/bin"


def test_each_ranks_threads_are_its_share_of_the_cores_slurm_gave_the_task(monkeypatch):
    """No controller asks a Slurm node for its cores before the job runs: the
    node fills in ``OMP_NUM_THREADS`` from its task's affinity, over its
    ranks, but never past the CPUs Slurm allocated to the task (a site that
    does not bind tasks leaves the whole node in the affinity); a value the
    user set is left as it is."""
    from orchestrator.agent.node import ompthreads

    monkeypatch.setattr(ompthreads, "usable_cores", lambda: 12)  # an unbound task's affinity
    job = _job_file()
    job["nodes"][0]["spec"].update(nproc=3, env={"OMP_NUM_THREADS": "<cores / ranks, at launch>"})
    job["nodes"][1]["spec"] = {**job["nodes"][1]["spec"], "env": {"OMP_NUM_THREADS": "5"}}

    def threads(environ: dict) -> str:
        return node_spec(JobSpec.from_dict(job), 0, {"addr": "host0", "port": 1},
                         environ).env["OMP_NUM_THREADS"]

    assert threads({}) == "4"  # a GPU job asks for no CPUs: the affinity's 12 over 3 ranks
    assert threads({"SLURM_CPUS_PER_TASK": "6"}) == "2"
    assert threads({"SLURM_CPUS_PER_TASK": "1"}) == "1"  # at least one thread
    assert threads({"SLURM_CPUS_PER_TASK": "48"}) == "4"  # a bound task's affinity is smaller
    assert threads({"SLURM_CPUS_PER_TASK": "x"}) == threads({"SLURM_CPUS_PER_TASK": "0"}) == "4"
    there = node_spec(JobSpec.from_dict(job), 1, {"addr": "host0", "port": 1},
                      {secret_variable(1, "K"): "v", "SLURM_CPUS_PER_TASK": "1"})
    assert there.env["OMP_NUM_THREADS"] == "5"


def test_the_agent_zipapp_runs_with_the_standard_library_alone(tmp_path):
    pyz = str(tmp_path / "agent.pyz")
    bootstrap.zipapp(pyz)
    usage = subprocess.run([sys.executable, "-I", "-S", pyz], capture_output=True, text=True)
    assert usage.returncode == 2 and "job JOB.json" in usage.stderr
    job = _job_file()
    job["nodes"][0]["spec"]["run_dir"] = str(tmp_path / "node-0")
    (tmp_path / "job.json").write_text(json.dumps(job))
    wrong = subprocess.run([sys.executable, "-I", "-S", pyz, "job", str(tmp_path / "job.json")],
                           capture_output=True, text=True, env={"SLURMD_NODENAME": "n7"})
    assert wrong.returncode != 0 and "Slurm node 'n7', which is not in the plan" in wrong.stderr
    # a job file that is not one: the field named, no traceback
    (tmp_path / "job.json").write_text(json.dumps({**job, "placed": "yes"}))
    bad = subprocess.run([sys.executable, "-I", "-S", pyz, "job", str(tmp_path / "job.json")],
                         capture_output=True, text=True, env={"SLURMD_NODENAME": "n1"})
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "ddp-orch agent: bad job file: 'placed' is 'yes': true or false" in bad.stderr


@pytest.mark.parametrize("gres, count", [("gpu:8", 8), ("gpu:a100:4(S:0-1)", 4), ("(null)", 0),
                                         ("gpu:2,gpu:tesla:2", 4), ("mps:100", 0)])
def test_gpus_are_counted_from_gres(gres, count):
    assert slurmctl.gpu_count(gres) == count


def test_node_states_that_cannot_take_a_job():
    def node(state):
        return slurmctl.NodeInfo("n", "n", state, 8, 0)

    assert node("idle").usable and node("mixed").usable and node("allocated").usable
    assert not any(node(s).usable for s in ("down*", "drained", "draining", "idle*", "fail"))


def test_a_run_directory_is_shared_when_the_nodes_are_this_machine_or_on_a_network_fs():
    import socket

    this = slurmctl.NodeInfo("n1", socket.gethostname(), "idle", 8, 0)
    other = slurmctl.NodeInfo("n2", "elsewhere", "idle", 8, 0)
    assert shared_dir_problem("/tmp/x", [this]) is None
    problem = shared_dir_problem("/tmp/x", [this, other])
    assert problem is not None and "--runs-dir" in problem and "do not share" in problem


def test_a_project_runs_under_slurm_with_the_same_argv_and_code_root(tmp_path):
    """workload.code, module and list args: job.json holds the dry-run's argv
    and the node's code root as torchrun's working directory, and the node
    spec each agent builds under srun keeps both; the bundle carries project/."""
    import tarfile

    from orchestrator.controller.session import prepare
    from orchestrator.records.rundir import RunDir

    project = tmp_path / "project"
    for rel in ("proj/__init__.py", "proj/train.py", "configs/x.yaml"):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text("")
    spec = load_cluster_text(
        "backend: slurm\nnodes: [{host: a, procs: 2}, {host: b, procs: 1}]\n"
        "workload:\n  code: project\n  module: proj.train\n  args: [50, 10, --config, "
        "configs/x.yaml]\n", source=str(tmp_path / "c.yaml"), base_dir=str(tmp_path))
    run = RunDir.create(str(tmp_path / "runs"), "r")
    backend, info = prepare(spec, LaunchOptions(), run_id="r", local_run_dir=run.path)
    assert any(note.startswith(f"code dir   {project}: 3 files") for note in info.notes)
    backend.write_job(info, run)
    job = json.loads(open(run.file("job.json")).read())
    for k, node in enumerate(job["nodes"]):
        argv = node["spec"]["argv"]
        assert argv[argv.index("ddp_orch_shim") + 1:] == \
            ["-m", "proj.train", "50", "10", "--config", "configs/x.yaml"]
        assert node["spec"]["cwd"] == f"{run.path}/node-{k}/project"
        where = {"addr": "127.0.0.1", "port": 12345}
        assert node_spec(JobSpec.from_dict(job), k, where, {}).cwd == node["spec"]["cwd"]
    from orchestrator.engine.nodespec import BUNDLE_NAME

    with tarfile.open(run.file(BUNDLE_NAME)) as tar:
        assert {"project/proj/train.py", "project/configs/x.yaml"} <= set(tar.getnames())


def test_the_job_id_is_found_from_its_own_file_when_the_nodes_records_lack_it(tmp_path):
    """A controller killed right after sbatch answered recorded no node
    connection yet: ``down`` and ``status`` still find the job by the id
    written beside the run (``JOB_ID_FILE``); anything else there is no id."""
    from orchestrator.backends.scheduler.backend import JOB_ID_FILE
    from orchestrator.records.rundir import RunDir
    from orchestrator.records.store import NodeRecord, RunRecord
    from orchestrator.records.outcome import RunState

    run = RunDir.create(str(tmp_path), "r1")
    record = RunRecord(run_id="r1", run=run, state=RunState.STARTING, backend="slurm",
                       started=1.0, wall_s=None,
                       nodes=(NodeRecord(0, "node1", str(tmp_path / "r1" / "node-0"), "python3"),),
                       outcomes=(), root_cause=None, controller_pid=None)
    backend = Backend(LaunchOptions())
    assert backend.job_of(record) is None
    run.write_text(JOB_ID_FILE, "4242\n")
    assert backend.job_of(record) == "4242"
    recorded = dataclasses.replace(record, nodes=(dataclasses.replace(
        record.nodes[0], connection={"slurm_job": "77"}),))
    assert backend.job_of(recorded) == "77"  # the record wins
    run.write_text(JOB_ID_FILE, "42; rm -rf /\n")
    assert backend.job_of(record) is None
