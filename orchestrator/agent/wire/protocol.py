"""The wire between the controller and a node agent; both sides import it.

One exec channel per node carries requests and ``Control`` words down and
control lines (``CONTROL_PREFIX`` and JSON) up, amid node output, so a node
needs only ``sshd`` and Python. A node is not trusted to send well-formed
data: everything is checked against ``MESSAGES`` or ``OPS`` before anyone
acts on it. Stdlib only, like the rest of the agent package.
"""

from __future__ import annotations

import json
import os
from enum import Enum
from typing import Any, Callable, Mapping, NamedTuple

from .fields import (FLAG, INT, LIST, NUMBER, RECORD, STRINGS, TEXT, TIME, Field, count,
                     first_bad, is_count, is_int, is_time, of_types, one_of, optional,
                     records_of)  # noqa: F401
from .runstate import KEPT_STATES

CONTROL_PREFIX = b"::ddp-orch:: "
# Liveness while a run is attached: each side sends something at least every
# HEARTBEAT_S (the controller ``ping``, the supervisor a heartbeat event); the
# other side gives up after PEER_TIMEOUT_S of silence. A partition that sends
# no FIN or RST (a pulled cable, a frozen sshd) is so noticed within 30 s on
# both sides, where TCP alone takes 15 minutes to hours.
HEARTBEAT_S = 5.0
PEER_TIMEOUT_S = 30.0


def controller_silent_for(timeout_s: float) -> str:
    """A node's stop reason when its controller went silent past ``timeout_s``."""
    return f"lost the controller (nothing from it for {timeout_s:g}s)"
MAX_CONTROL_LINE = 1 << 20  # a longer control line is a broken or hostile node
MAX_TRANSFER = 1 << 30  # no single put/get is larger (bundles are capped far below)



MAX_REASON = 300  # characters of the reason a ``stop`` carries


class Control(Enum):
    """The words on a node's stdin once its agent supervises (or follows) a
    run, one a line. ``stop`` may carry who stopped the run and why. Senders
    use ``encode``, readers ``parse`` and ``reason``; nobody matches the bytes."""

    PING = "ping"  # the controller is still there (every HEARTBEAT_S)
    GO = "go"  # every node's ``setup:`` is done: torchrun may start
    STOP = "stop"  # graceful teardown: SIGTERM, the grace period, SIGKILL
    KILL = "kill"  # teardown now, no grace
    DONE = "done"  # the controller has the exit event: the channel is the agent's again

    def encode(self, reason: str = "") -> bytes:
        """The word's line, with ``reason`` (printable, at most ``MAX_REASON``)."""
        said = "".join(c for c in reason if c.isprintable())[:MAX_REASON].strip()
        return (f"{self.value} {said}" if said else self.value).encode("utf-8") + b"\n"

    @classmethod
    def parse(cls, line: bytes) -> "Control | None":
        """The word on ``line``, any reason ignored; None for anything else."""
        try:
            return cls(line.strip().split(b" ", 1)[0].decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            return None

    @staticmethod
    def reason(line: bytes) -> str:
        """The reason after ``line``'s word ("" for none), printable and capped."""
        said = line.strip().split(b" ", 1)[1:]
        text = said[0].decode("utf-8", "replace") if said else ""
        return "".join(c for c in text if c.isprintable())[:MAX_REASON].strip()


class Ended(str, Enum):
    """How a node's torchrun ended (the exit event's ``ended``). Whoever decides
    on an end reads this, never the event's ``reason`` words."""

    __str__ = str.__str__

    ITSELF = "itself"  # before any stop was asked: the node's own outcome, never "stopped"
    STOPPED = "stopped"  # asked to: the controller (``stop``, ``kill``), the gang, ``down``
    SIGNAL = "signal"  # the supervisor got SIGTERM/SIGINT/SIGHUP: scancel, srun, an operator
    CONTROLLER_LOST = "controller-lost"  # its controller went silent, or its channel closed
    SETUP_FAILED = "setup-failed"  # the run's ``setup:`` failed: torchrun never started
    REFUSED = "refused"  # nothing ran: the node could not take the run (its spec, the job)


class Event(str, Enum):
    """Each control message's ``event``; a ``str``, so it equals the decoded word."""

    __str__ = str.__str__

    HELLO = "hello"
    REPLY = "reply"
    JOINED = "joined"
    HEARTBEAT = "heartbeat"
    STARTED = "started"
    SETUP = "setup"
    EXIT = "exit"
    ATTEMPT = "attempt"
    FINISHED = "finished"
    GANG_HELLO = "gang-hello"
    GANG_START = "gang-start"
    GANG_STOP = "gang-stop"
    GANG_ENDED = "gang-ended"
    GANG_FAILING = "gang-failing"
    GANG_FINISH = "gang-finish"
    GANG_SETUP = "gang-setup"
    GANG_GO = "gang-go"
    GANG_PROGRESS = "gang-progress"
    GANG_STACKS = "gang-stacks"
    GANG_STACKS_DONE = "gang-stacks-done"


# What each control message carries, by its event: field -> what its value
# must be (``fields``; a name ending in "?" may be absent). ``validate``
# checks every message against this and nothing else.
_TRANSFER = Field(lambda v: is_int(v) and 0 <= v <= MAX_TRANSFER,
                  f"a payload size (0 to {MAX_TRANSFER} bytes)")
_FAILURE = {"local_rank": count(), "message": TEXT, "timestamp": TIME,
            "error_file?": optional(TEXT)}
_SURVIVOR = {"pid": INT, "cmd": TEXT}
FAILURES = records_of(_FAILURE, "a list of worker failures (local_rank, message, timestamp)")
MESSAGES: dict[Event, dict[str, Field]] = {
    # ``cores``: the CPUs the agent may run on (``node/ompthreads.usable_cores``)
    Event.HELLO: {"home": TEXT, "pid": INT, "python": TEXT, "cores": INT},
    Event.REPLY: {"ok": FLAG, "size?": _TRANSFER},
    Event.JOINED: {},
    Event.HEARTBEAT: {},
    Event.STARTED: {"workers": INT},
    # A node's ``setup:`` ended (``node/nodesetup.py``); torchrun waits for every node's.
    Event.SETUP: {"ok": FLAG},
    # ``exit_event`` builds it: torchrun's code and why it ended
    # (``ended`` is absent from a record an older agent wrote: no cause known)
    Event.EXIT: {"code": INT, "reason": TEXT, "ended?": one_of(list(Ended)),
                 "failures": FAILURES, "last_lines": STRINGS,
                 "duration_s": TIME, "stopped_at?": optional(TIME),
                 "survivors?": records_of(_SURVIVOR, "a list of {pid, cmd} records")},
    # A kept run (``kept/keeper.py``): its node's stream (``agent.out``) marks each
    # attempt and ends with ``finished``; node 0's carries the gang's attempts.
    Event.ATTEMPT: {"attempt": INT, "master_port": INT},
    Event.FINISHED: {"code": INT, "state": one_of(KEPT_STATES)},
    # Between the keepers of a kept run, over node 0's gang port (``kept/peers.py``).
    Event.GANG_HELLO: {"node_rank": INT, "token": TEXT},
    Event.GANG_START: {"attempt": INT, "master_port": INT},
    Event.GANG_STOP: {"attempt": INT, "reason": TEXT, "final": FLAG},
    Event.GANG_ENDED: {"attempt": INT, "exit": RECORD},
    Event.GANG_FAILING: {"attempt": INT, "code": INT},
    Event.GANG_FINISH: {"state": one_of(KEPT_STATES)},
    # A node's setup is done (to the head); every node's is (from the head).
    Event.GANG_SETUP: {"node_rank": INT},
    Event.GANG_GO: {},
    # A node's torchrun has started, and its ranks' progress {rank: [step, age_s]},
    # [step, age_s, samples] or [step, age_s, samples or null, compute_s, data_s]
    # (``rank_progress``; every ``peers.GANG_HEARTBEAT_S``,
    # to the head: the start timeout, the hang rule).
    Event.GANG_PROGRESS: {"attempt": INT, "started": FLAG, "progress": RECORD},
    # A hang: every node dumps its ranks' stacks into ``stacks/<stamp>/`` (from
    # the head), and says where each rank stands (to the head).
    Event.GANG_STACKS: {"attempt": INT, "stamp": TEXT},
    Event.GANG_STACKS_DONE: {"attempt": INT, "places": RECORD},
}


class OpSpec(NamedTuple):
    """One request the agent serves: the fields it takes, and those an ``ok``
    reply carries. ``replies`` is None for an op that takes the channel over
    and has no reply (``supervise``, ``follow``)."""

    takes: dict[str, Field]
    replies: dict[str, Field] | None


_HOST = optional(TEXT)
OPS: dict[str, OpSpec] = {
    "mkrun": OpSpec({"run_dir": TEXT, "root": TEXT}, {"path": TEXT}),
    "discard": OpSpec({}, {"removed": LIST}),
    "put": OpSpec({"path": TEXT, "size": INT, "sha256": TEXT, "mode?": INT}, {"path": TEXT}),
    "get": OpSpec({"path": TEXT, "max": INT, "root?": TEXT}, {"size": INT, "sha256": TEXT}),
    "outputs": OpSpec({"root": TEXT, "patterns": LIST, "max_file": INT, "max_total": INT},
                      {"files": LIST, "refused": LIST}),
    "prune": OpSpec({"run_dir": TEXT, "run_id": TEXT, "node_rank": INT},
                    {"freed": INT, "path": TEXT}),
    "bind": OpSpec({"port": INT, "host?": _HOST, "hold?": FLAG}, {"port": INT}),
    "route": OpSpec({"host": TEXT, "port": INT, "remote_peers?": FLAG},
                    {"ifname": TEXT, "addr": TEXT}),
    "torch": OpSpec({}, {}),
    "gpus": OpSpec({"want": of_types(str, list), "run_id": TEXT, "node_rank?": INT,
                    "busy_mib": INT, "allow_busy?": FLAG, "hold?": FLAG, "rehearsal?": FLAG,
                    "busy_util?": INT, "ignore?": LIST, "exclude?": LIST, "lock_dir?": TEXT},
                   {"gpus": LIST}),
    "probe": OpSpec({}, {"python": TEXT}),
    "clock": OpSpec({}, {"time": NUMBER}),
    "listen": OpSpec({"port": INT, "addr?": _HOST, "host?": _HOST, "ifname?": _HOST,
                      "timeout?": NUMBER}, {"addr": TEXT, "port": INT}),
    # one connection (addr, port), or a list of [addr, port] at once (targets: results)
    "connect": OpSpec({"addr?": TEXT, "port?": INT, "targets?": LIST, "timeout?": NUMBER}, {}),
    "down": OpSpec({"run_id": TEXT, "node_rank": INT, "run_dir?": _HOST, "grace_s?": NUMBER,
                    "why?": TEXT}, {"killed": LIST, "survivors": LIST}),
    "stacks": OpSpec({"run_id": TEXT, "run_dirs?": RECORD, "native?": FLAG,
                      "timeout?": NUMBER}, {"size": INT, "sha256": TEXT}),
    "keeper": OpSpec({"run_dir": TEXT}, {"alive": FLAG, "now": NUMBER}),
    "detach": OpSpec({"spec": RECORD, "listen?": FLAG}, {"pid": INT}),
    "supervise": OpSpec({"spec": RECORD}, None),
    "follow": OpSpec({"run_dir": TEXT, "offset?": INT, "lines?": optional(INT),
                      "attached?": FLAG}, None),
}


def message(event: Event, **fields: Any) -> dict[str, Any]:
    """A control message, checked as its receiver checks it (``validate``), so
    no sender can build one every receiver would drop."""
    return validate({"event": event.value, **fields})


def exit_event(code: int, reason: str, ended: Ended, *, duration_s: float,
               failures: list | tuple = (), last_lines: list | tuple = (),
               stopped_at: float | None = None, survivors: list | tuple = (),
               **extra: Any) -> dict[str, Any]:
    """A node's exit event, the one shape every sender builds."""
    return {"event": Event.EXIT.value, "code": code, "reason": reason, "ended": ended.value,
            "failures": list(failures), "stopped_at": stopped_at,
            "last_lines": list(last_lines), "survivors": list(survivors),
            "duration_s": duration_s, **extra}


class RankProgress(NamedTuple):
    """A rank's progress entry, read: its step, age on the node's clock, samples
    so far, and seconds per step outside collectives (None: not reported)."""

    step: Any
    age_s: float
    samples: int | None = None
    compute_s: float | None = None
    data_s: float | None = None

    @property
    def pace(self) -> tuple[float, float] | None:
        """``(compute_s, data_s)``, or None where the rank reported neither."""
        return None if self.compute_s is None else (self.compute_s, self.data_s)


def rank_progress(value: Any) -> RankProgress | None:
    """A rank's entry, ``[step, age_s]``, ``[step, age_s, samples]`` or with
    ``compute_s, data_s`` too; None for anything else. The step is the caller's to check."""
    if not (isinstance(value, list) and len(value) in (2, 3, 5)):
        return None
    if not all(is_time(t) for t in (value[1], *value[3:])):
        return None
    samples = value[2] if len(value) >= 3 else None
    if len(value) == 3 and not is_count(samples) \
            or len(value) == 5 and samples is not None and not is_count(samples):
        return None
    return RankProgress(value[0], float(value[1]), samples,
                        *(float(t) for t in value[3:]))


# A rank's seconds per step outside collectives, as its records name them
# (``progress.json``, ``keeper.json``, ``status --json``, ``top --json``).
PACE_KEYS = ("compute_s", "data_s")


def pace_fields(pace: tuple[float, float] | None) -> dict[str, float]:
    """``{"compute_s": c, "data_s": d}`` for a rank's pace, {} for none."""
    return {} if pace is None else dict(zip(PACE_KEYS, pace))


class ProtocolError(ValueError):
    """A message that does not follow this protocol."""


def encode(message: dict[str, Any]) -> bytes:
    """One control line (the caller writes any payload right after it)."""
    return CONTROL_PREFIX + json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """A control line's message, checked against ``MESSAGES``; else ProtocolError,
    never another exception (a line deep enough to exhaust recursion included)."""
    if not line.startswith(CONTROL_PREFIX):
        raise ProtocolError("not a control line")
    if len(line) > MAX_CONTROL_LINE:
        raise ProtocolError(f"control line of {len(line)} bytes")
    try:
        message = json.loads(line[len(CONTROL_PREFIX):])
        return validate(message)
    except ProtocolError:
        raise
    except ValueError as exc:
        raise ProtocolError(f"control line is not JSON: {exc}") from None
    except Exception as exc:  # noqa: BLE001 ("[" * 4000: RecursionError; anything else)
        # Whatever a line does to the parser, it is a malformed line: a reader
        # that lets it escape dies without reporting its link lost.
        raise ProtocolError(f"malformed control line: {type(exc).__name__}") from None


def check_fields(what: str, value: dict[str, Any], table: Mapping[str, Field]) -> None:
    """``value`` against its table; ProtocolError names the first bad field."""
    bad = first_bad(value, table)
    if bad is not None:
        raise ProtocolError(f"{what}: bad or missing {bad[0]!r}")


def validate(message: Any) -> dict[str, Any]:
    """``message`` if it is a control message as ``MESSAGES`` declares; else ProtocolError."""
    try:
        event = Event(message.get("event"))  # type: ignore[union-attr]
    except (AttributeError, ValueError, TypeError):
        raise ProtocolError(f"unknown control message: {str(message)[:200]}") from None
    check_fields(f"{event} message", message, MESSAGES[event])
    return message


def request(op: str, **fields: Any) -> bytes:
    """One request line, checked as the agent checks it: a request it would
    refuse is the controller's bug, raised here."""
    return json.dumps(check_request({"op": op, **fields}), separators=(",", ":")).encode() + b"\n"


def check_request(asked: Any) -> dict[str, Any]:
    """A request as ``OPS`` declares it; else ProtocolError."""
    op = asked.get("op") if isinstance(asked, dict) else None
    if not isinstance(op, str) or op not in OPS:
        raise ProtocolError(f"unknown request {op!r}")
    check_fields(f"{op} request", asked, OPS[op].takes)
    return asked


def check_reply(op: str, reply: dict[str, Any]) -> dict[str, Any]:
    """A reply to ``op``; an ``ok`` one carries the fields ``OPS`` says, so they
    can be indexed; else ProtocolError."""
    fields = OPS[op].replies
    if reply.get("ok") and fields:
        check_fields(f"{op} reply", reply, fields)
    return reply


def digest(data: bytes) -> str:
    import hashlib  # (only file moves need it: not ps, status or a dry run)

    return hashlib.sha256(data).hexdigest()


class LineBuffer:
    """Turns a byte stream into blocks of whole lines; a partial line waits for
    its newline unless it outgrows ``max_line``.
    """

    def __init__(self, max_line: int = 1 << 20):
        self.max_line = max_line
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < self.max_line:
            self.pending = data
            return b""
        cut = cut or len(data)
        self.pending = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest


class Reader:
    """Buffered reads from a file descriptor, by line or by exact size. Raw
    ``os.read``, so whoever reads the fd next, through this reader, misses nothing.
    """

    def __init__(self, read: Callable[[int], bytes] | int):
        self._read = read if callable(read) else (lambda n, fd=read: os.read(fd, n))
        self.buffer = b""
        self.eof = False

    def _fill(self) -> bool:
        if self.eof:
            return False
        chunk = self._read(65536)
        if not chunk:
            self.eof = True
            return False
        self.buffer += chunk
        return True

    def readline(self, limit: int = MAX_CONTROL_LINE) -> bytes:
        """One line with its newline; b"" at EOF (a partial last line is dropped)."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > limit:
                raise ProtocolError(f"line longer than {limit} bytes")
            if not self._fill():
                return b""
        cut = self.buffer.index(b"\n") + 1
        line, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return line

    def read_exact(self, size: int) -> bytes:
        """Exactly ``size`` bytes; ProtocolError if the stream ends first."""
        while len(self.buffer) < size:
            if not self._fill():
                raise ProtocolError(f"stream ended {size - len(self.buffer)} bytes early")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data
