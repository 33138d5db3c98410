"""The rank plan: pure code from spec to per-node facts, and the torchrun argv built from them."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.config.loader import load_cluster_file, load_cluster_text
from orchestrator.plan.build import build_plan, resolve_plan
from orchestrator.plan.model import GpuChoice
from orchestrator.plan.torchrun import torchrun_argv

RUN = "demo-run"


def plan_of(text: str):
    spec = load_cluster_text(textwrap.dedent(text), source="c.yaml")
    return build_plan(spec, run_id=RUN, local_run_dir=f"/tmp/runs/{RUN}")


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_seed_layout_ranks_are_prefix_sums():
    spec = load_cluster_file("cluster.yaml.example")
    plan = build_plan(spec, run_id=RUN, local_run_dir="runs/" + RUN)
    assert plan.world_size == 7
    assert [(r.rank, r.node_rank, r.local_rank, r.gpu) for r in plan.ranks] == [
        (0, 0, 0, 3), (1, 0, 1, 4), (2, 0, 2, 5),
        (3, 1, 0, 0), (4, 1, 1, 1), (5, 1, 2, 2), (6, 1, 3, 3)]
    n0, n1 = plan.nodes
    assert (list(n0.ranks), list(n1.ranks)) == ([0, 1, 2], [3, 4, 5, 6])
    assert n0.env["CUDA_VISIBLE_DEVICES"] == "3,4,5"
    assert n1.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    for k, node in enumerate(plan.nodes):
        argv = torchrun_argv(plan, node)
        assert flag(argv, "--nnodes") == "2"
        assert flag(argv, "--node-rank") == str(k)
        assert flag(argv, "--nproc-per-node") == str(node.nproc)
        assert flag(argv, "--master-addr") == "192.168.1.100"
        assert flag(argv, "--master-port") == "29500"
        assert flag(argv, "--rdzv-backend") == "static"
        assert argv[:3] == ("python3", "-m", "torch.distributed.run")
        assert argv[-4:] == ("-m", "workloads.linear", "--epochs", "10")


def test_cuda_visible_devices_keeps_the_users_gpu_order():
    """``gpus: 3,1,2`` means local rank 0 on GPU 3, 1 on GPU 1, 2 on GPU 2:
    CUDA_VISIBLE_DEVICES lists them in that order, before and after the
    launch (a choice the node made keeps its order too)."""
    plan = plan_of("""\
        nodes:
          - {host: a, gpus: '3,1,2'}
          - {host: b, gpus: [2, 0]}
          - {host: c, gpus: free:2}
        workload: {name: linear}
        """)
    assert [n.env["CUDA_VISIBLE_DEVICES"] for n in plan.nodes[:2]] == ["3,1,2", "2,0"]
    assert [n.gpus for n in plan.nodes[:2]] == [(3, 1, 2), (2, 0)]
    assert [(r.rank, r.node_rank, r.local_rank, r.gpu) for r in plan.ranks] == [
        (0, 0, 0, 3), (1, 0, 1, 1), (2, 0, 2, 2), (3, 1, 0, 2), (4, 1, 1, 0),
        (5, 2, 0, None), (6, 2, 1, None)]
    resolved = resolve_plan(plan, master_port=29500, homes={},
                            gpus={2: GpuChoice((5, 4)), 1: GpuChoice((2, 0))})
    assert [n.env["CUDA_VISIBLE_DEVICES"] for n in resolved.nodes] == ["3,1,2", "2,0", "5,4"]
    assert [r.gpu for r in resolved.ranks] == [3, 1, 2, 2, 0, 5, 4]


def test_an_uneven_three_node_layout_numbers_every_rank():
    """3 + 1 + 4 processes: global ranks are prefix sums (0-2, 3, 4-7),
    local ranks restart per node, the world size is 8 on every node."""
    plan = plan_of("""\
        master: {addr: 10.0.0.1, port: 29500}
        nodes:
          - {host: a, gpus: '3,4,5'}
          - {host: b, gpus: 0}
          - {host: c, gpus: '0,1,2,3'}
        workload: {name: linear}
        """)
    assert plan.world_size == 8
    assert [(r.rank, r.node_rank, r.host, r.local_rank, r.gpu) for r in plan.ranks] == [
        (0, 0, "a", 0, 3), (1, 0, "a", 1, 4), (2, 0, "a", 2, 5),
        (3, 1, "b", 0, 0),
        (4, 2, "c", 0, 0), (5, 2, "c", 1, 1), (6, 2, "c", 2, 2), (7, 2, "c", 3, 3)]
    assert [(n.first_rank, n.nproc, list(n.ranks)) for n in plan.nodes] == [
        (0, 3, [0, 1, 2]), (3, 1, [3]), (4, 4, [4, 5, 6, 7])]
    assert [n.env["CUDA_VISIBLE_DEVICES"] for n in plan.nodes] == ["3,4,5", "0", "0,1,2,3"]
    for k, node in enumerate(plan.nodes):
        argv = torchrun_argv(plan, node)
        assert flag(argv, "--nnodes") == "3" and flag(argv, "--node-rank") == str(k)
        assert flag(argv, "--nproc-per-node") == ["3", "1", "4"][k]
    # resolved: the same numbers (no node chose anything at launch)
    resolved = resolve_plan(plan, master_port=29500, homes={})
    assert resolved.world_size == 8
    assert [(r.rank, r.local_rank) for r in resolved.ranks] == [
        (0, 0), (1, 1), (2, 2), (3, 0), (4, 0), (5, 1), (6, 2), (7, 3)]


def test_worker_identical_is_always_unset():
    plan = plan_of("""\
        env: {NCCL_DEBUG: INFO}
        nodes:
          - {host: a, gpus: [0]}
          - {host: b, gpus: [0, 1]}
        workload: {name: linear}
        """)
    for node in plan.nodes:
        assert node.unset_env == ("TORCH_ELASTIC_WORKER_IDENTICAL",)
        assert "TORCH_ELASTIC_WORKER_IDENTICAL" not in node.env
        assert node.env["NCCL_DEBUG"] == "INFO"


def test_master_defaults_to_first_host_and_port_auto():
    plan = plan_of("nodes:\n  - {host: h0, gpus: 0}\n  - {host: h1, gpus: 0}\n"
                   "workload: {name: linear}\n")
    assert plan.master_addr == "h0" and plan.master_port == "auto"
    assert not plan.resolved


def test_procs_nodes_run_on_cpu_and_hide_gpus():
    plan = plan_of("nodes:\n  - {host: localhost, procs: 1}\n  - {host: localhost, procs: 2}\n"
                   "workload: {name: linear}\n")
    assert plan.device == "cpu" and plan.master_addr == "127.0.0.1"
    assert [n.env["DDP_ORCH_DEVICE"] for n in plan.nodes] == ["cpu", "cpu"]
    assert [n.env["CUDA_VISIBLE_DEVICES"] for n in plan.nodes] == ["", ""]
    assert [n.run_dir for n in plan.nodes] == [f"/tmp/runs/{RUN}/node-0", f"/tmp/runs/{RUN}/node-1"]
    assert [list(n.ranks) for n in plan.nodes] == [[0], [1, 2]]


def test_env_marks_every_process_of_the_run():
    plan = plan_of("nodes:\n  - {host: a, gpus: 0}\n  - {host: b, gpus: 1}\nworkload: {name: linear}\n")
    for node in plan.nodes:
        assert node.env["DDP_ORCH_RUN_ID"] == RUN
        assert node.env["DDP_ORCH_NODE_RANK"] == str(node.node_rank)
        assert node.env["DDP_ORCH_RESULT_FILE"] == f"{node.run_dir}/result.json"
        assert node.env["PYTHONPATH"] == f"{node.run_dir}/code"
        assert node.run_dir == f"~/.ddp-orch/runs/{RUN}/node-{node.node_rank}"


def test_resolve_fills_port_and_home_only():
    plan = plan_of("nodes:\n  - {host: a, gpus: 0}\n  - {host: b, gpus: 1}\nworkload: {name: linear}\n")
    resolved = resolve_plan(plan, master_port=31337, homes={0: "/home/u", 1: "/root"})
    assert resolved.resolved and resolved.master_port == 31337
    n0, n1 = resolved.nodes
    argv0, argv1 = (torchrun_argv(resolved, n) for n in resolved.nodes)
    assert flag(argv0, "--master-port") == "31337"
    assert n0.run_dir == f"/home/u/.ddp-orch/runs/{RUN}/node-0"
    assert n1.env["PYTHONPATH"] == f"/root/.ddp-orch/runs/{RUN}/node-1/code"
    assert flag(argv1, "--log-dir") == f"/root/.ddp-orch/runs/{RUN}/node-1/torchrun"
    before = torchrun_argv(plan, plan.nodes[0])
    changed = [i for i, (a, b) in enumerate(zip(before, argv0)) if a != b]
    assert [before[i - 1] for i in changed] == ["--master-port", "--log-dir"]
    assert plan.nodes[0].env.keys() == n0.env.keys()


def test_script_workload_runs_from_uploaded_dir(tmp_path):
    (tmp_path / "train.py").write_text("")
    spec = load_cluster_text("nodes:\n  - {host: a, gpus: 0}\nworkload:\n  script: train.py\n"
                             "  args: {lr: 0.1, amp: true, tags: [x, y]}\n",
                             source="c.yaml", base_dir=str(tmp_path))
    plan = build_plan(spec, run_id=RUN, local_run_dir="r")
    node = plan.nodes[0]
    argv = torchrun_argv(plan, node)
    tail = argv[argv.index("--redirects") + 2:]
    # through the worker shim, in the node's copy of the script's directory, as typed there
    assert tail == ("-m", "ddp_orch_shim", "train.py", "--lr", "0.1", "--amp", "--tags", "x", "y")
    assert node.code_root == f"{node.run_dir}/project" and plan.code == str(tmp_path)
    assert plan.workload == "train.py"


def program_of(plan, k=0):
    """The words after the shim: what every rank of node ``k`` runs, and where."""
    argv = torchrun_argv(plan, plan.nodes[k])
    return argv[argv.index("ddp_orch_shim") + 1:]


def project_plan(project, workload: str, local_run_dir="/tmp/runs/r"):
    spec = load_cluster_text("nodes:\n  - {host: a, procs: 2}\n  - {host: b, procs: 1}\n"
                             "workload:\n" + textwrap.indent(textwrap.dedent(workload), "  "),
                             source=str(project / "cluster.yaml"), base_dir=str(project))
    return build_plan(spec, run_id=RUN, local_run_dir=local_run_dir)


def test_a_module_runs_from_the_code_root_with_its_arguments_verbatim(project):
    plan = project_plan(project, """\
        code: .
        module: proj.train
        args: [configs/x.yaml, --lr=0.1, -v, -v, 50, 10, 0.10, "yes", "", 'a b']
        """)
    words = ("configs/x.yaml", "--lr=0.1", "-v", "-v", "50", "10", "0.10", "yes", "", "a b")
    assert program_of(plan) == ("-m", "proj.train", *words)
    assert program_of(plan, 1) == program_of(plan)
    assert plan.code == str(project) and plan.workload == "proj.train"
    assert [n.code_root for n in plan.nodes] == [
        f"~/.ddp-orch/runs/{RUN}/node-0/project", f"~/.ddp-orch/runs/{RUN}/node-1/project"]
    # ddp-orch's own paths stay absolute: the result file, the logs, the built-ins
    node = plan.nodes[0]
    assert node.env["DDP_ORCH_RESULT_FILE"] == f"{node.run_dir}/result.json"
    assert node.env["PYTHONPATH"] == f"{node.run_dir}/code"
    assert flag(torchrun_argv(plan, node), "--log-dir") == f"{node.run_dir}/torchrun"


def test_a_script_is_relative_to_the_code_root(project):
    plan = project_plan(project, """\
        code: .
        script: scripts/train.py
        args: [50, 10]
        """)
    assert program_of(plan) == ("scripts/train.py", "50", "10")
    assert plan.name == "train"


def test_the_resolved_plan_keeps_the_code_root_in_the_resolved_run_dir(project):
    plan = project_plan(project, "code: .\nmodule: proj.train\n")
    resolved = resolve_plan(plan, master_port=1234, homes={0: "/home/u", 1: "/root"})
    assert [n.code_root for n in resolved.nodes] == [
        f"/home/u/.ddp-orch/runs/{RUN}/node-0/project", f"/root/.ddp-orch/runs/{RUN}/node-1/project"]


def test_a_builtin_workload_starts_in_the_code_directory_it_comes_in():
    plan = plan_of("nodes:\n  - {host: a, gpus: 0}\nworkload: {name: linear}\n")
    node = plan.nodes[0]
    assert node.code_root == f"{node.run_dir}/code" and plan.code is None
    assert program_of(plan) == ("-m", "workloads.linear")


def test_the_command_line_program_replaces_the_files(project):
    from orchestrator.config.localmode import with_program

    spec = load_cluster_text("nodes:\n  - {host: a, procs: 2}\nworkload:\n  code: .\n"
                             "  module: proj.train\n  args: [--old]\n",
                             source=str(project / "cluster.yaml"), base_dir=str(project))
    typed = ("scripts/train.py", "--config", "configs/x.yaml", "50", "10")
    plan = build_plan(with_program(spec, typed), run_id=RUN, local_run_dir="/r")
    assert program_of(plan) == typed
    plan = build_plan(with_program(spec, ("-m", "proj.train", "-v", "--", "x")), run_id=RUN,
                      local_run_dir="/r")
    assert program_of(plan) == ("-m", "proj.train", "-v", "--", "x")
    assert plan.code == str(project)


def mutable_parts(value, where: str = "plan"):
    """Every mutable thing reachable from ``value``, by path: what a backend
    could change under the dry-run's feet. A frozen dataclass is walked
    field by field, a read-only mapping (``MappingProxyType``) and a tuple
    item by item; scalars are immutable; anything else is named."""
    import dataclasses
    from types import MappingProxyType

    if dataclasses.is_dataclass(value):
        if not type(value).__dataclass_params__.frozen:
            yield f"{where} ({type(value).__name__} is not frozen)"
        for field in dataclasses.fields(value):
            yield from mutable_parts(getattr(value, field.name), f"{where}.{field.name}")
    elif isinstance(value, MappingProxyType):
        for key, item in value.items():
            yield from mutable_parts(item, f"{where}[{key!r}]")
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from mutable_parts(item, f"{where}[{i}]")
    elif not isinstance(value, (str, int, float, bool, type(None))):
        yield f"{where} ({type(value).__name__})"


def test_the_plan_and_the_resolved_plan_are_immutable_all_the_way_down():
    import dataclasses

    plan = plan_of("""\
        nodes:
          - {host: a, gpus: "0,1"}
          - {host: b, gpus: 0, env: {X: "1"}}
        workload: {name: linear, args: {epochs: 2}}
        setup: [pip install -r requirements.txt, [python, -V]]
        outputs: [out/]
    """)
    resolved = resolve_plan(plan, master_port=1234, homes={0: "/home/u"},
                            interfaces={0: "eth0", 1: "ens5"})
    for each in (plan, resolved):
        assert list(mutable_parts(each)) == []
        with pytest.raises(dataclasses.FrozenInstanceError):
            each.nodes[0].nproc = 9  # type: ignore[misc]
        with pytest.raises(TypeError, match="does not support item assignment"):
            each.nodes[0].env["X"] = "1"  # type: ignore[index]
    # The walk sees what it is meant to: a mutable part anywhere is named.
    thawed = dataclasses.replace(plan, nodes=(dataclasses.replace(plan.nodes[0], env={}),
                                              *plan.nodes[1:]), setup=[("true",)])
    assert list(mutable_parts(thawed)) == ["plan.nodes[0].env (dict)", "plan.setup (list)"]


def test_the_plan_holds_facts_not_backend_settings():
    """No SSH settings, no argv: a backend derives those from the plan."""
    plan = plan_of("nodes:\n  - {host: a, gpus: 0, ssh: {user: u}}\nworkload: {name: linear}\n")
    fields = set(type(plan.nodes[0]).__dataclass_fields__)
    assert not fields & {"ssh", "argv", "is_local"}
    assert plan.backend == "ssh"


def test_every_attempt_of_a_kept_run_starts_the_same_program_in_the_same_code_root(project):
    """A kept run's keeper restarts from the supervisor spec the dry-run made:
    the same working directory, the program's words untouched."""
    from orchestrator.agent.kept.keeper import attempt_spec
    from orchestrator.engine.nodespec import supervisor_spec
    from orchestrator.plan.dryrun import NodeLaunch

    plan = resolve_plan(project_plan(project, "code: .\nmodule: proj.train\nargs: [50, 10]\n"),
                        master_port=29500, homes={0: "/home/u", 1: "/home/v"})
    node = plan.nodes[1]
    launch = NodeLaunch(node=node, where="x", env=node.env, unset_env=node.unset_env,
                        argv=torchrun_argv(plan, node))
    spec = supervisor_spec(launch, plan.run_id, 29500, 5.0)
    assert spec.cwd == f"/home/v/.ddp-orch/runs/{RUN}/node-1/project"
    again = attempt_spec(spec, 2, 31337)
    assert again.cwd == spec.cwd
    assert again.argv[again.argv.index("ddp_orch_shim") + 1:] == \
        ("-m", "proj.train", "50", "10")


def test_a_python_under_home_is_each_nodes_own_in_the_dry_run_and_at_launch():
    """``python: ~/venv/bin/python`` (issue 32): the dry-run shows it as the
    node's shell reads it (``"$HOME"/venv/bin/python``, its directory first
    on PATH for setup), and the launch fills in each node's own home, as it
    does for ``workdir``'s ``~``, in torchrun's argv and setup's PATH."""
    from orchestrator.controller.session import prepare
    from orchestrator.engine.nodespec import supervisor_spec
    from orchestrator.engine.options import LaunchOptions
    from orchestrator.plan.render import render_text
    from orchestrator.plan.shell import render_shell

    spec = load_cluster_text("python: ~/venv/bin/python\nsetup: pip install x\n"
                             "nodes: [{host: a, procs: 1}, {host: b, procs: 1}]\n"
                             "workload: {name: noop}\n", source="c.yaml")
    backend, info = prepare(spec, LaunchOptions(), run_id=RUN, local_run_dir=f"/tmp/runs/{RUN}")
    text = render_text(info)
    assert text.count('\n    "$HOME"/venv/bin/python -m torch.distributed.run ') == 2
    assert text.count(", ~/venv/bin first on PATH\n") == 2
    shell = render_shell(info)
    assert shell.count('PATH="$HOME"/venv/bin:"$PATH" sh -c ') == 2
    assert shell.count(' "$HOME"/venv/bin/python -m torch.distributed.run ') == 2
    resolved = backend.dryrun(resolve_plan(info.plan, master_port=29500,
                                           homes={0: "/home/u", 1: "/root"}))
    assert [n.argv[0] for n in resolved.nodes] == ["/home/u/venv/bin/python",
                                                   "/root/venv/bin/python"]
    assert [supervisor_spec(n, RUN, 29500, 3.0).setup["path_first"]
            for n in resolved.nodes] == ["/home/u/venv/bin", "/root/venv/bin"]
