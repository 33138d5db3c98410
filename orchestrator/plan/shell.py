"""The dry-run as shell lines that start the run by hand (``--format shell``).

They run as printed, in order, and do what ``up`` does, with exactly the
dry-run's torchrun argv; what only a launch knows is settled as the launch
does. Secret env values are never printed: a line takes each from the
node's environment and stops if it is unset.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from typing import Sequence

from ..agent.node.ompthreads import AT_LAUNCH, OMP_VAR
from ..agent.wire.addr import hostport
from ..config.spec import AUTO_PORT, DEFAULT_PORT
from .build import setup_path_first
from .dryrun import DryRun, NodeLaunch
from .network import AUTO, IFNAME_VARS, value_for
from .secrets import is_secret
from .torchrun import SHIM

PORT_WORD = f'"${{MASTER_PORT:-{DEFAULT_PORT}}}"'  # one port on every node, stated
ADDR_WORD = '"$MASTER_ADDR"'  # node 0's host name, once the job runs


def shell_word(word: str) -> str:
    """``shlex.quote``, except a leading ``~/`` (also in ``NAME=~/x``) stays
    expandable: ``'~/x'`` would reach the program as a literal tilde."""
    name, eq, value = word.partition("=")
    if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and value.startswith("~/"):
        return f"{name}=" + shell_word(value)
    if word == "~" or word.startswith("~/"):
        rest = word[2:]
        return '"$HOME"' + (("/" + shlex.quote(rest)) if rest else "")
    return shlex.quote(word)


def shell_join(words: Sequence[str]) -> str:
    return " ".join(shell_word(w) for w in words)


def render_shell(info: DryRun, bundle: Sequence[str] = (),
                 bundle_path: str = "bundle.tar.gz") -> str:
    """The lines; ``bundle`` is the argv that writes the bundle to ``bundle_path`` here."""
    plan, hand = info.plan, info.by_hand
    bundle = tuple(bundle) or ("ddp-orch", "bundle", "--output", bundle_path,
                               info.source or "CLUSTER_FILE")
    auto_port = plan.master_port == AUTO_PORT
    addr = ADDR_WORD if hand.master_host else plan.master_addr
    out = [f"# {plan.run_id}: world size {plan.world_size}, master "
           f"{hostport(plan.master_addr, plan.master_port)}, backend {info.backend}"]
    if hand.allocate:
        out += ["# To start it by hand as `up` does: run these lines here, in this directory, in",
                f"# order; those after `{hand.allocate[0]}` in the shell it opens, where each "
                "node's line", "# runs on its node as a step, all at once."]
    else:
        out += ["# To start it by hand as `up` does: run the lines for this machine here, in",
                "# this directory, in order; then each node's line on that node, all at about",
                "# the same time (torchrun's static rendezvous waits for every node)."]
    if auto_port:
        out += ["# The master port is auto: `up` picks a free one on node 0 at launch; these",
                f"# lines use $MASTER_PORT, {DEFAULT_PORT} unless you set it (the same on "
                "every node)."]
    if hand.master_host:
        out.append("# The master address is node 0's host name, known once the job runs "
                   "($MASTER_ADDR).")
    secrets = sorted({k for n in info.nodes for k, v in n.env.items() if is_secret(k, v)})
    if secrets:
        out.append(f"# Secret values are not printed: the lines take {', '.join(secrets)} "
                   "from the node's environment.")
    if info.owner.detached or info.max_restarts:
        out.append("# By hand nothing keeps the run: no --detach, no gang restarts.")
    out += ["# Worker output goes to files (--redirects 3), which `up` relays; by hand:",
            "# tail -F torchrun/*/attempt_0/*/std*.log in a node's run directory.",
            "", "# this machine: the code `up` uploads (the built-in workloads, the worker shim,",
            "# your workload.code), unpacked into each node's run directory",
            shell_join(bundle)]
    out += [_unpack(node, hand.reach.get(node.node_rank, ()), bundle_path) for node in info.nodes]
    if hand.allocate:
        out += ["", "# this machine: an allocation of the job's nodes, with the job's own options",
                shell_join(hand.allocate)]
    if hand.master_host:
        out += ["# node 0's host name: the master address, as node 0's agent publishes it",
                f"export MASTER_ADDR=\"$({shell_join(hand.master_host)} < /dev/null)\""]
    for node in info.nodes:
        line = node_shell_line(node, addr, auto_port)
        step = hand.step.get(node.node_rank)
        if step:
            # stdin from /dev/null: a step would take the shell's own input
            line = f"{shell_join([*step, 'sh', '-c'])} {shlex.quote(line)} < /dev/null &"
        out += ["", f"# {node.header()}", line]
    if hand.step:
        out += ["", "# every node's step, until the run ends", "wait"]
    return "\n".join(out) + "\n"


def _unpack(node: NodeLaunch, reach: Sequence[str], bundle_path: str) -> str:
    """The line that unpacks the bundle into ``node``'s run directory, over ``reach``."""
    run_dir = shell_word(node.run_dir)
    if reach:
        remote = f"mkdir -p {run_dir} && tar -xzf - -C {run_dir}"
        return f"{shell_join(reach)} {shlex.quote(remote)} < {shell_word(bundle_path)}"
    return f"mkdir -p {run_dir} && tar -xzf {shell_word(bundle_path)} -C {run_dir}"


# The shell twin of the agent's interface choice (agent/node/netroute.py): the
# source address of the kernel's route to the master, and the interface
# that holds it. Node 0 reaching its own address gets its NIC, not lo.
_FIND_IFNAME = ("ifname=\"$(ip -o addr show to \"$(ip -o route get {addr} | "
                "sed -n 's/.* src \\([^ ]*\\).*/\\1/p')\" | awk '{{print $2; exit}}')\" && ")
# iproute2 takes addresses only: a host name is resolved first, as the agent does.
_RESOLVED = "\"$(getent ahosts {addr} | awk '{{print $1; exit}}')\""
# The node's usable cores (its affinity, as the agent counts them); nproc
# itself would answer with an OMP_NUM_THREADS the shell has.
_FIND_CORES = 'cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" && '


def node_shell_line(node: NodeLaunch, master_addr: str, auto_port: bool = False) -> str:
    """One line that starts this node by hand, in its code root; ``master_addr``
    is shell text already when not a plain word."""
    env = node.env
    auto = [k for k in IFNAME_VARS if env.get(k) == AUTO]
    env_words = ["env", *(shell_word(w) for name in node.unset_env for w in ("-u", name))]
    share = max(1, node.node.nproc)
    for name, value in env.items():
        if name in auto:
            continue
        if name == OMP_VAR and value == AT_LAUNCH:  # each rank's share of the cores
            env_words.append(f'{name}="$(( cores / {share} > 0 ? cores / {share} : 1 ))"')
            continue
        env_words.append(f'{name}="${{{name}:?export {name} on this node first}}"'
                         if is_secret(name, value) else shell_word(f"{name}={value}"))
    words = " ".join(env_words)
    addr = master_addr if master_addr == ADDR_WORD else shell_word(master_addr)
    find = ""
    if auto:
        target = addr if _is_address(master_addr) else _RESOLVED.format(addr=addr)
        find = _FIND_IFNAME.format(addr=target)
    cores = _FIND_CORES if env.get(OMP_VAR) == AT_LAUNCH else ""  # before setup: it has the env
    chosen = "".join(f' {k}="{value_for(k, "$ifname")}"' for k in auto)
    code = shell_word(node.node.code_root)
    setup = ""
    if node.setup:  # in the code root, each command with the run's env, before torchrun
        first = setup_path_first(node.node.python)  # the run's python's pip, as the agent does
        path = f' PATH={shell_word(first)}:"$PATH"' if first else ""
        setup = "".join(f"{words}{path} {shell_join(argv)} && " for argv in node.setup)
    argv = _torchrun_words(node.argv, addr if master_addr == ADDR_WORD else None,
                           PORT_WORD if auto_port else None)
    # torchrun starts in the code root, as the node's agent starts it
    return f"cd {code} && {cores}{setup}{find}{words}{chosen} {argv}"


def _torchrun_words(argv: Sequence[str], addr: str | None, port: str | None) -> str:
    """``argv`` as shell words, the master address and port as shell text when given."""
    words = [shell_word(w) for w in argv]
    end = argv.index(SHIM) if SHIM in argv else len(argv)
    for i in range(end - 1):
        if argv[i] == "--master-addr" and addr is not None:
            words[i + 1] = addr
        elif argv[i] == "--master-port" and port is not None:
            words[i + 1] = port
    return " ".join(words)


def _is_address(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
        return True
    except ValueError:
        return False
