"""Launch a resolved plan on its nodes and own the run until it is over.

Lifecycle: every node is prepared (uploads) in parallel, then every node's
supervisor starts in parallel (from the standby the session opened early,
see ``node.STANDBY``). The launcher then watches them. When one
node fails, the others are stopped at once (gang semantics). Whatever
happens (success, failure, Ctrl-C, an exception), the ``finally`` block
stops every node still running: ``stop`` on stdin, a deadline, then the
connection is cut, which the supervisors also treat as "tear down".
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TypeVar

from .console import Console
from .errors import LaunchError
from .node import NodeHandle, NodeOutcome
from .plan import RunPlan
from .runs import RunDir
from .transport.base import ProcessHandle, Transport, TransportError

T = TypeVar("T")


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    state: str  # succeeded | failed | interrupted
    wall_s: float
    nodes: tuple[NodeOutcome, ...]
    root_cause: NodeOutcome | None
    result: dict | None

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"


def parallel(fn: Callable[[T], object], items: Sequence[T], what: str,
             label: Callable[[T], str] = str) -> None:
    """Run ``fn`` on every item at once; raise one LaunchError naming each failure."""
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        futures = [(item, pool.submit(fn, item)) for item in items]
    problems = []
    for item, future in futures:
        exc = future.exception()
        if isinstance(exc, TransportError):  # it names the host itself; the label does
            problems.append(f"  {label(item)}: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
        elif isinstance(exc, (LaunchError, OSError)):
            problems.append(f"  {label(item)}: {exc}")
        elif exc is not None:
            raise exc
    if problems:
        raise LaunchError(f"{what} failed:\n" + "\n".join(problems))


class Launch:
    """One launch of a resolved plan; ``run()`` returns its ``RunOutcome``."""

    def __init__(self, plan: RunPlan, run: RunDir, transports: Mapping[int, Transport],
                 console: Console, *, bundle_path: str, grace_s: float = 10.0,
                 start_timeout_s: float = 300.0,
                 standbys: Mapping[int, ProcessHandle] | None = None):
        self.plan = plan
        self.run_dir = run
        self.console = console
        self.bundle_path = bundle_path
        self.grace_s = grace_s
        self.start_timeout_s = start_timeout_s
        self._changed = threading.Event()  # some node's command ended
        standbys = standbys or {}
        self.handles = [NodeHandle(node, transports[node.node_rank], run, console,
                                   on_change=self._changed.set,
                                   standby=standbys.get(node.node_rank))
                        for node in plan.nodes]
        self.interrupted = False

    def run(self) -> RunOutcome:
        started = time.monotonic()
        try:
            parallel(lambda h: h.prepare(self.bundle_path, self.plan.run_id, self.grace_s),
                     self.handles, "uploading to the nodes", _label)
            parallel(lambda h: h.start(), self.handles, "starting the nodes", _label)
            self.console.info(f"started {self.plan.world_size} processes on "
                              f"{len(self.handles)} node(s); logs in {self.run_dir.path}")
            self._watch()
        except KeyboardInterrupt:
            self.interrupted = True
            self.console.always("ddp-orch: interrupted; stopping every node "
                                "(press Ctrl-C again to kill at once)")
        finally:
            self._teardown()
        outcomes = tuple(h.finish() for h in self.handles)
        return self._outcome(outcomes, time.monotonic() - started)

    def _watch(self) -> None:
        """Wait for every node; on the first failure or a start timeout, ask
        all to stop and return: ``_teardown`` enforces the deadline."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            self._changed.clear()
            codes = [h.poll() for h in self.handles]
            if all(code is not None for code in codes):
                return
            failed = [h for h, code in zip(self.handles, codes) if code not in (None, 0)]
            if failed:
                first = failed[0]
                self._stop_all(f"node {first.node.node_rank} ({first.node.host}) failed "
                               f"(exit {first.poll()})")
                return
            elif time.monotonic() > deadline and not all(h.started for h in self.handles):
                missing = [h for h in self.handles if not h.joined] or \
                    [h for h in self.handles if not h.started]
                for handle in missing:
                    handle.timed_out = True
                names = ", ".join(_label(h) for h in missing)
                self._stop_all(f"the rendezvous did not complete within "
                               f"{self.start_timeout_s:g}s; not joined: {names}")
                return
            self._changed.wait(0.5)  # woken at once when a node ends

    def _stop_all(self, why: str) -> None:
        self.console.info(f"{why}; stopping every node")
        for handle in self.handles:
            handle.stop()

    def _teardown(self) -> None:
        """Stop what still runs: gracefully, then SIGKILL through the
        supervisors, then cut them off. A 2nd Ctrl-C skips the grace period."""
        for handle in self.handles:  # those that never started (uploads failed)
            handle.discard_standby()
        running = [h for h in self.handles if h.process is not None and h.poll() is None]
        if not running:
            return
        try:
            for handle in running:
                handle.stop()
            _wait_all(running, self.grace_s + 5.0)
        except KeyboardInterrupt:
            self.console.always("ddp-orch: second interrupt; killing now")
        finally:
            for handle in running:
                handle.kill()
            _wait_all(running, 5.0)
            for handle in running:
                handle.abort()

    def _outcome(self, outcomes: tuple[NodeOutcome, ...], wall_s: float) -> RunOutcome:
        failed = [o for o in outcomes if o.state in ("failed", "lost")]
        root = min(failed, key=lambda o: (o.first_failure_ts or float("inf"), o.node_rank),
                   default=None)
        if self.interrupted:
            state = "interrupted"
        elif root is not None or any(o.state != "succeeded" for o in outcomes):
            state = "failed"
        else:
            state = "succeeded"
        return RunOutcome(self.plan.run_id, state, wall_s, outcomes, root, None)


def _label(handle: NodeHandle) -> str:
    return f"node {handle.node.node_rank} ({handle.node.host})"


def _wait_all(handles: list[NodeHandle], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(h.poll() is None for h in handles):
        time.sleep(0.05)
