"""The agent's request loop: what a node does for the controller, on one channel.

It says hello, then answers requests one at a time until stdin closes:

=============  ==============================================================
``mkrun``      create the run directory, refusing one that exists or a root not ours
``discard``    remove the run directories this agent created (a launch abandoned)
``put``        receive a file (size and SHA-256 checked), write it atomically
``get``        send a regular file back, size-capped (and, given a root, inside it)
``outputs``    which files of a run's ``outputs:`` may come home
``prune``      remove an ended run's node directory, never a live one
``bind``       can the master port be bound here (0: pick a free one)
``route``      the interface and address this node's ranks use
``torch``      start asking the node's torch about CUDA, in a child
``gpus``       the GPUs the run gets here, locked for its life, with torch's answer
``probe``      Python, torch, CUDA, NCCL and the host name, for ``ddp-orch check``
``clock``      this node's ``time.time()``, for ``ddp-orch check``'s skew check
``listen``     hold a test listener in the background; replies with its port
``connect``    open TCP connections (one, or a list at once)
``down``       end a run's processes here, found by their marker variables
``stacks``     dump the run's ranks' stacks here
``supervise``  become the run's node supervisor; the reply is its output
``detach``     start the node's keeper of a kept run, as a daemon
``follow``     stream a kept run's ``agent.out``; the agent's last request
``keeper``     a kept run's ``keeper.json`` here, and whether its keeper runs
=============  ==============================================================

EOF before ``supervise`` means the controller is done with this node, or
gave up on the launch: the agent exits having started nothing. After the
supervisor's exit event, the controller sends ``done`` and may then ``get``
files over the same channel; the agent exits with torchrun's code at EOF,
or at once when the supervisor gave up on a silent controller.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Callable

from . import files

from ..node import probes, procs
from ..node.holdings import Holdings
from ..node.ompthreads import usable_cores
from .protocol import (OPS, Control, Ended, Event, ProtocolError, Reader, check_request, digest, encode,
                       exit_event, message)

_LOCK = threading.Lock()  # one writer of stdout at a time: a reply, a listener's thread


class Session:
    """What one channel's requests share. ``discard`` removes only the run
    directories in ``made``; after a refused ``mkrun``, pipelined uploads must
    not land. torch's answer goes with every ``gpus`` reply, so the last of a
    ``--wait-gpus`` wait is the one ``device: auto`` is decided on."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.refused = False
        self.code: int | None = None  # torchrun's exit code, once a run was supervised
        self.over = False  # the agent exits now, not at EOF
        self.holdings = Holdings()  # the master port and GPU locks, for its supervisor
        self._probe = None  # gpuclaim.TorchProbe, until its answer is read
        self._torch: dict | None = None

    def ask_torch(self) -> None:
        from ..node import gpuclaim

        self._probe, self._torch = gpuclaim.TorchProbe(), None

    def torch_answer(self) -> dict | None:
        """The probe's answer (read on first use), None when ``torch`` was not asked."""
        if self._probe is not None:
            self._torch, self._probe = self._probe.result(), None
        return self._torch


Handler = Callable[[Session, dict, Reader], None]
ANSWERS: dict[str, Handler] = {}
# The ops a node still serves once a run was supervised: its files come home.
_AFTER_A_RUN = ("get", "outputs")


def answers(op: str) -> Callable[[Handler], Handler]:
    """Binds a handler to ``op``, one of ``protocol.OPS``, which checks what it takes."""
    def bind(handler: Handler) -> Handler:
        if op not in OPS or op in ANSWERS:
            raise LookupError(f"{op!r}: not an op of protocol.OPS, or bound twice")
        ANSWERS[op] = handler
        return handler
    return bind


def reply(payload: bytes = b"", **fields) -> None:
    if payload:
        fields["size"] = len(payload)
    said = message(Event.REPLY, **fields)
    with _LOCK:
        out = sys.stdout.buffer
        out.write(encode(said) + payload)
        out.flush()


def serve() -> int:
    stdin = Reader(0)
    session = Session()
    with _LOCK:
        sys.stdout.buffer.write(encode(message(Event.HELLO, home=probes.home(), pid=os.getpid(),
                                               python=sys.executable, cores=usable_cores())))
        sys.stdout.buffer.flush()
    while not session.over:
        line = stdin.readline()
        if not line:
            break
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            reply(ok=False, error=f"bad request: {exc}")
            continue
        op = request.get("op")
        try:
            check_request(request)
        except ProtocolError as exc:
            if op == "put" and isinstance(request.get("size"), int) and request["size"] >= 0:
                stdin.read_exact(request["size"])  # its payload is no request line
            reply(ok=False, error=str(exc))
            continue
        try:
            if session.code is not None and op not in _AFTER_A_RUN:
                raise ValueError("after a run only `get` and `outputs` are served")
            ANSWERS[op](session, request, stdin)
        except (files.TransferError, ProtocolError, OSError, KeyError, TypeError,
                ValueError) as exc:
            session.refused = session.refused or op == "mkrun"
            reply(ok=False, error=str(exc) or type(exc).__name__)
    return session.code or 0


@answers("supervise")
def _supervise(session: Session, request: dict, stdin: Reader) -> None:
    from ..node.spec import SpecError
    from ..node.supervisor import Supervisor

    try:
        supervisor = Supervisor(request["spec"], stdin, holdings=session.holdings)
    except SpecError as exc:  # the run's end, said as any run's end is
        session.code = _refuse_spec(str(exc), stdin)
        return
    session.code = supervisor.run()
    if supervisor.controller_lost:
        # It went silent (a partition, a frozen host): no `done`, no `get`
        # will come, and its EOF may take hours (TCP). Waiting for it would
        # leave this process behind on the node.
        session.over = True
    elif supervisor.watcher.is_alive():
        supervisor.watcher.join()  # until `done` or EOF: then stdin is ours again


@answers("follow")
def _follow(session: Session, request: dict, stdin: Reader) -> None:
    from ..kept import daemon

    daemon.follow(request["run_dir"], stdin, offset=request.get("offset", 0),
                  lines=request.get("lines"), attached=request.get("attached", False))
    session.over = True


def _refuse_spec(why: str, stdin: Reader) -> int:
    """A ``supervise`` whose spec is not one: the exit event says why; then,
    as after any run, stdin is the controller's until ``done`` or EOF."""
    with _LOCK:
        sys.stdout.buffer.write(encode(exit_event(1, why, Ended.REFUSED, duration_s=0,
                                                  last_lines=[f"ddp-orch: {why}"])))
        sys.stdout.buffer.flush()
    while True:
        line = stdin.readline()
        if not line or Control.parse(line) is Control.DONE:
            return 1


@answers("put")
def _put(session: Session, request: dict, stdin: Reader) -> None:
    if session.refused:
        stdin.read_exact(request["size"])
        raise files.TransferError("not written: the run directory was refused")
    data = stdin.read_exact(request["size"])
    path = files.put(request["path"], data, size=request["size"], sha256=request["sha256"],
                     mode=request.get("mode", 0o600))
    reply(ok=True, path=path)


@answers("mkrun")
def _mkrun(session: Session, request: dict, stdin: Reader) -> None:
    session.made.append(files.make_run_dir(request["run_dir"], request["root"]))
    reply(ok=True, path=session.made[-1])


@answers("discard")
def _discard(session: Session, request: dict, stdin: Reader) -> None:
    import shutil

    for path in session.made:  # only what this channel created: the launch was abandoned
        shutil.rmtree(path, ignore_errors=True)
    session.holdings.release_gpus()
    reply(ok=True, removed=list(session.made))
    session.made.clear()


@answers("get")
def _get(session: Session, request: dict, stdin: Reader) -> None:
    if request.get("root") is not None:
        from ..node.outputs import inside

        if not inside(request["root"], request["path"]):
            raise files.TransferError(f"{request['path']}: not fetched: it leads out of "
                                      f"{request['root']} (a symbolic link?)")
    data = files.get(request["path"], request["max"])
    if data is None:
        reply(ok=False, missing=True, error=f"{request['path']}: no such file")
    else:
        reply(data, ok=True, size=len(data), sha256=digest(data))


@answers("bind")
def _bind(session: Session, request: dict, stdin: Reader) -> None:
    # ``hold``: a launch's port, held until this agent's supervisor starts
    # torchrun (or the agent ends); `check` only asks whether it is free
    reply(**probes.bind(request["port"], request.get("host"),
                        holdings=session.holdings if request.get("hold", False) else None))


@answers("route")
def _route(session: Session, request: dict, stdin: Reader) -> None:
    from ..node import netroute

    reply(**netroute.route(request["host"], request["port"], request.get("remote_peers", True)))


@answers("torch")
def _torch(session: Session, request: dict, stdin: Reader) -> None:
    session.ask_torch()
    reply(ok=True)


@answers("gpus")
def _gpus(session: Session, request: dict, stdin: Reader) -> None:
    from ..node import gpuclaim

    want = request["want"]
    answer = gpuclaim.claim(
        want if isinstance(want, str) else [int(k) for k in want],
        run_id=request["run_id"], node_rank=request.get("node_rank", 0),
        busy_mib=request["busy_mib"], allow_busy=request.get("allow_busy", False),
        holdings=session.holdings if request.get("hold", True) else None, rehearsal=request.get("rehearsal", False),
        lock_dir=request.get("lock_dir"),
        **({"busy_util": request["busy_util"]} if "busy_util" in request else {}),
        ignore=[str(rule) for rule in request.get("ignore", [])],
        exclude=[int(k) for k in request.get("exclude", [])])
    seen = session.torch_answer()
    if seen is not None:
        answer["torch"] = seen
    answer["limits"] = probes.limits()  # what NCCL will have here besides the GPUs
    reply(**answer)


@answers("outputs")
def _outputs(session: Session, request: dict, stdin: Reader) -> None:
    from ..node import outputs

    reply(**outputs.collect(request["root"], [str(p) for p in request["patterns"]],
                            request["max_file"], request["max_total"]))


@answers("prune")
def _prune(session: Session, request: dict, stdin: Reader) -> None:
    from ..node import prune

    reply(**prune.prune(request["run_dir"], request["run_id"], request["node_rank"]))


@answers("probe")
def _probe(session: Session, request: dict, stdin: Reader) -> None:
    reply(**probes.probe())


@answers("clock")
def _clock(session: Session, request: dict, stdin: Reader) -> None:
    import time

    reply(ok=True, time=time.time())


@answers("listen")
def _listen(session: Session, request: dict, stdin: Reader) -> None:
    sock = probes.listener(request["port"], addr=request.get("addr"), host=request.get("host"),
                           ifname=request.get("ifname"))
    addr, port = sock.getsockname()[:2]
    # In the background: the agent answers further requests (the checks'
    # connections) meanwhile; it ends at its timeout or when the agent does.
    threading.Thread(target=probes.serve_listener, daemon=True,
                     args=(sock, float(request.get("timeout", 120)), threading.Event())).start()
    reply(ok=True, addr=str(addr), port=int(port))


@answers("connect")
def _connect(session: Session, request: dict, stdin: Reader) -> None:
    timeout = float(request.get("timeout", 5))
    if "targets" in request:
        reply(ok=True, results=probes.connect_all(request["targets"], timeout))
    else:
        reply(**probes.connect(request["addr"], request["port"], timeout))


@answers("stacks")
def _stacks(session: Session, request: dict, stdin: Reader) -> None:
    from ..node import stacks

    dirs = {int(k): str(v) for k, v in request.get("run_dirs", {}).items()}
    ranks = stacks.dump(request["run_id"], dirs, request.get("native", False),
                        float(request.get("timeout", 5)))
    data = json.dumps(ranks).encode()  # a payload: dumps outgrow a control line
    reply(data, ok=True, sha256=digest(data))


@answers("keeper")
def _keeper(session: Session, request: dict, stdin: Reader) -> None:
    from ..kept import mailbox

    reply(**mailbox.state(request["run_dir"]))


@answers("detach")
def _detach(session: Session, request: dict, stdin: Reader) -> None:
    from ..kept import daemon

    reply(**daemon.start(request["spec"], request.get("listen", False), session.holdings))


@answers("down")
def _down(session: Session, request: dict, stdin: Reader) -> None:
    from ..kept import mailbox

    grace_s = float(request.get("grace_s", 5))
    run_dir = request.get("run_dir")
    keeper = mailbox.stop(run_dir, grace_s + 15, request.get("why") or mailbox.DOWN_REASON) \
        if run_dir else None
    marker = procs.run_marker(request["run_id"], request["node_rank"])
    killed, survivors = procs.terminate(lambda: procs.marked_processes(marker), grace_s,
                                        still_ours=lambda pid: procs.has_marker(pid, marker))
    if keeper:  # it tore its node down and ended, or it would not
        killed.add(keeper)
        if mailbox.keeper_pid(run_dir) == keeper:
            survivors[keeper] = procs.command_line(keeper) + " (the run's keeper)"
    reply(ok=True, killed=sorted(killed),
          survivors=[{"pid": pid, "cmd": cmd} for pid, cmd in survivors.items()])


if set(ANSWERS) != set(OPS):  # an op declared and not served, at import, not at its first use
    raise LookupError(f"protocol.OPS without a handler here: {sorted(set(OPS) - set(ANSWERS))}")
