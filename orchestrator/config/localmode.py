"""``up --local``: the same job on this machine, without SSH: an ordinary
``ClusterSpec`` with one ``localhost`` node, so plan, launch and records are the same."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from ..errors import ConfigError
from .catalog import builtin
from .loader import (check_workload_args, cuda_without_gpus, default_name, env_name_problem,
                     module_name, module_warning, one_index_warning, parse_gpus, script_in,
                     too_broad)
from .spec import AUTO_PORT, DEFAULT_WORKDIR, ClusterSpec, NodeSpec, SshSpec, WorkloadSpec
from .yamlsrc import closest_hint

CLI = "command line"
PROGRAM = "-- PROGRAM"  # the field path of errors in the words after `--`
INTERPRETERS = ("python", "python3", "torchrun")


def local_spec(base: ClusterSpec | None, *, workload: str | None, gpus: str | None,
               procs: int | None, device: str | None, args: Mapping[str, Any],
               program: tuple[str, ...] | None = None) -> ClusterSpec:
    """One localhost node running ``base``'s workload, or ``workload``, or
    ``program`` (the words after ``--``; without a file, in the current directory)."""
    if gpus is not None and procs is not None:
        raise ConfigError("give --gpus or --procs, not both", source=CLI)
    if program is not None:
        if workload is not None:
            raise ConfigError("give --workload or a program after --, not both", source=CLI)
        if base is not None:
            base = with_program(base, program)
        else:
            chosen = program_workload(None, program, os.getcwd())
            base = ClusterSpec(name=default_name(chosen), backend="local", master_addr=None,
                               master_port=AUTO_PORT, workdir=DEFAULT_WORKDIR, device="auto",
                               env={}, nodes=(), workload=chosen, source=CLI,
                               base_dir=os.getcwd())
    if base is None and workload is None:
        raise ConfigError("nothing to run", source=CLI,
                          hint="pass a cluster file, --workload NAME (see `ddp-orch workloads`) "
                               "or your program after --: -- train.py ARGS")
    request = None
    warnings: tuple[str, ...] = ()
    if gpus is not None:
        try:
            gpu_list, nproc = parse_gpus(gpus), None
        except ValueError as exc:
            raise ConfigError(exc.args[0], path="--gpus", source=CLI, hint=exc.args[1]) from None
        warned = one_index_warning(gpus, gpu_list, "--gpus")
        warnings = (warned,) if warned else ()
        if isinstance(gpu_list, str):  # --gpus free:2: chosen at launch
            request, gpu_list = gpu_list, None
    else:
        gpu_list, nproc = None, procs if procs is not None else _default_procs(base)
    chosen = choose_workload(base, workload, args)
    python = base.nodes[0].python if base and base.nodes else "python3"
    env = dict(base.env) if base else {}
    node = NodeSpec(host="localhost", gpus=gpu_list, procs=nproc, ssh=SshSpec(),
                    python=_local_python(python), env=env, gpu_request=request)
    fields = dict(backend="local", master_addr=None, master_port=AUTO_PORT, nodes=(node,), workload=chosen,
                  device=device or (base.device if base else "auto"), warnings=warnings)
    _check_device(fields["device"], node, device, procs, base)
    if base is not None:
        return dataclasses.replace(base, **fields)
    return ClusterSpec(name=chosen.label, workdir=DEFAULT_WORKDIR, env=env,
                       source=CLI, text="", **fields)


def _check_device(chosen: str, node: NodeSpec, device: str | None, procs: int | None,
                  base: ClusterSpec | None) -> None:
    """The loader's ``cuda_without_gpus`` rule, said in the options' words."""
    if not cuda_without_gpus(chosen, (node,)):
        return
    count = f"{node.procs} CPU process{'' if node.procs == 1 else 'es'}"
    cpu = f"--procs {node.procs} runs {count}" if procs is not None else \
        f"without --gpus, --local runs {count}"
    if device is not None:
        raise ConfigError(f"--device cuda, but {cpu}, which have no GPU and cannot join a "
                          "CUDA job", path="--device", source=CLI,
                          hint="give the GPUs with --gpus 0,1, or leave out --device (or "
                               "--device cpu)")
    raise ConfigError(f"{cpu}, but {base.source if base else 'the file'} says device: cuda; "
                      "CPU processes have no GPU and cannot join a CUDA job",
                      path="--procs" if procs is not None else "--local", source=CLI,
                      hint="give the GPUs with --gpus 0,1, or run on CPU with --device cpu")


def _default_procs(base: ClusterSpec | None) -> int:
    """Without --gpus/--procs: node 0's process count, else 2 (a real DDP pair)."""
    return base.nodes[0].nproc if base and base.nodes else 2


def _local_python(python: str) -> str:
    """The cluster's interpreter, unless it is the bare default: then ours, whose
    venv has torch beside ddp-orch (not whatever ``python3`` is first on PATH)."""
    import sys

    return sys.executable if python == "python3" else python


def with_args(spec: ClusterSpec, args: Mapping[str, Any]) -> ClusterSpec:
    """``spec`` with ``--arg`` values merged over its workload's args."""
    if not args:
        return spec
    return dataclasses.replace(spec, workload=choose_workload(spec, None, args))


def with_env(spec: ClusterSpec, pairs: tuple[str, ...]) -> ClusterSpec:
    """``spec`` with ``up --env KEY=VALUE`` over every node's env: the command
    line wins over the file's ``env:``, under the same name rules."""
    given: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"{pair!r} is not KEY=VALUE", path="--env", source=CLI,
                              hint="--env NCCL_DEBUG=INFO (repeat --env for more)")
        problem = env_name_problem(name)
        if problem:
            message = problem[0] if name in problem[0] else f"{name!r}: {problem[0]}"
            raise ConfigError(message, path="--env", source=CLI,
                              hint=problem[1] or "")
        given[name] = value
    if not given:
        return spec
    return dataclasses.replace(
        spec, env={**spec.env, **given},
        nodes=tuple(dataclasses.replace(node, env={**node.env, **given}) for node in spec.nodes))


def with_program(spec: ClusterSpec, words: tuple[str, ...]) -> ClusterSpec:
    """``spec`` running ``words`` (``up FILE -- PROGRAM ARGS``) from the same code
    directory; a run name that was the old workload's default follows the new one."""
    workload = program_workload(spec.workload, words, spec.base_dir)
    name = default_name(workload) if spec.name == default_name(spec.workload) else spec.name
    return dataclasses.replace(spec, workload=workload, name=name)


def program_workload(base: WorkloadSpec | None, words: tuple[str, ...],
                     base_dir: str) -> WorkloadSpec:
    """The workload of ``-- PROGRAM ARGS``, as torchrun takes it (``train.py ARGS``
    or ``-m pkg.train ARGS``), in ``base``'s code directory, else ``base_dir``
    (a built-in workload has none)."""
    code = base.code if base is not None and base.code else os.path.abspath(base_dir)
    usage = ("PROGRAM is your script, relative to the code directory (-- train.py --lr 0.1), "
             "or a module (-- -m pkg.train --lr 0.1); ddp-orch's own options go before --")
    if not words:
        raise ConfigError("nothing after --", path=PROGRAM, source=CLI, hint=usage)
    why = too_broad(code)
    if why:
        raise ConfigError(f"the code directory {code} {why}; all of it would be uploaded to "
                          "every node", path=PROGRAM, source=CLI,
                          hint="run from a cluster file whose workload.code is your project's "
                               "own directory")
    head, rest = words[0], tuple(words[1:])
    if head == "-m":
        if not rest:
            raise ConfigError("-m without a module name", path=PROGRAM, source=CLI, hint=usage)
        try:
            module = module_name(rest[0])
        except ValueError as exc:
            raise ConfigError(exc.args[0], path=PROGRAM, source=CLI, hint=exc.args[1]) from None
        given = ("the cluster file's workload.code" if base is not None and base.code
                 else "the cluster file's directory" if base is not None
                 else "the current directory, without a cluster file")
        warned = module_warning(module, code, PROGRAM, given)
        return WorkloadSpec(name=None, script=None, args=rest[1:], module=module, code=code,
                            warnings=(warned,) if warned else ())
    if head.startswith("-"):
        raise ConfigError(f"{head!r} is not a program", path=PROGRAM, source=CLI,
                          hint=usage + "; to change only the arguments, give the program too")
    if os.path.basename(head) in INTERPRETERS:
        raise ConfigError(f"{head!r}: ddp-orch starts python through torchrun itself",
                          path=PROGRAM, source=CLI,
                          hint="give what follows it: -- train.py ARGS or -- -m pkg.train ARGS")
    try:
        script = script_in(code, head, True)
    except ValueError as exc:
        message, hint = exc.args
        raise ConfigError(message, path=PROGRAM, source=CLI, hint=hint) from None
    return WorkloadSpec(name=None, script=script, args=rest, module=None, code=code)


def choose_workload(base: ClusterSpec | None, name: str | None,
                    args: Mapping[str, Any]) -> WorkloadSpec:
    """The file's workload (or the built-in ``name``) with ``args`` merged, checked."""
    catalog = base.catalog if base is not None else builtin()
    if name is not None:
        if name not in catalog:
            raise ConfigError(f"unknown workload {name!r}", path="--workload", source=CLI,
                              hint=closest_hint(name, catalog) or "see `ddp-orch workloads`")
        chosen = WorkloadSpec(name=name, script=None, args={})
    else:
        chosen = base.workload
    if isinstance(chosen.args, tuple) and args:
        raise ConfigError("--arg sets one flag of the mapping form of workload.args, but this "
                          "workload's args are a list", path="--arg", source=CLI,
                          hint="give the whole command line instead: ddp-orch up FILE -- "
                               "PROGRAM ARGS")
    merged = {**chosen.args, **args} if not isinstance(chosen.args, tuple) else chosen.args
    if chosen.name is not None:
        try:
            merged = check_workload_args(catalog[chosen.name], merged)
        except ValueError as exc:
            key, message, hint = exc.args
            raise ConfigError(message, path=f"--arg {key}", source=CLI, hint=hint) from None
    return dataclasses.replace(chosen, args=merged)
