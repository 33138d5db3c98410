"""The worker shim: every rank runs the user's program through this module.

torchrun starts ``python -m ddp_orch_shim <script.py | -m module> ARGS``.
The program runs as a fresh ``__main__``, as plain ``python`` runs it, with
what no script has to ask for:

* an uncaught exception goes to torchrun's error file, as ``@record`` would,
  its traceback starting at the user's first frame. One whose class sets
  ``ONE_LINE_ERROR`` (a bad argument) prints as one line, not a traceback
  every rank repeats;
* ``faulthandler`` on ``STACK_SIGNAL`` writes the main thread's stack even
  while the rank is blocked in a C call such as a collective. The main
  thread only: reading other threads' frames from a handler can crash
  CPython while one imports, and a dump must never kill a healthy rank;
* where torch's flight recorder is on, a write to the FIFO
  ``stacks/rank-<RANK>.fr`` dumps it while the main thread is blocked.
  torch's own pipe does it for NCCL alone; this serves gloo too.
"""

from __future__ import annotations

import faulthandler
import json
import os
import runpy
import signal
import sys
import time
import traceback


# A real-time signal: SIGUSR1/SIGUSR2 are what Slurm, Lightning and submitit
# use for preemption and requeueing, and a user's handler must not fire on a dump.
STACK_SIGNAL = signal.SIGRTMIN + 7
STACKS_DIR = "stacks"
RESULT_FILE_ENV = "DDP_ORCH_RESULT_FILE"  # workloads/contract.py's: <node run dir>/result.json
ONE_LINE_ERROR = "ddp_orch_one_line"  # workloads/contract.py's: a class attribute


def run_dir() -> str:
    """The node's run directory (a rank's cwd is the code root); cwd when run by hand."""
    result = os.environ.get(RESULT_FILE_ENV)
    return os.path.dirname(os.path.abspath(result)) if result else os.getcwd()


def stacks_file(run_dir: str, rank: str) -> str:
    return os.path.join(run_dir, STACKS_DIR, f"rank-{rank}.txt")


def _arm_stack_dumps() -> None:
    """faulthandler on STACK_SIGNAL, into this rank's stacks file (kept open)."""
    rank = os.environ.get("RANK")
    if rank is None:
        return
    path = stacks_file(run_dir(), rank)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life)
    except OSError:
        return
    faulthandler.register(STACK_SIGNAL, file=handle, all_threads=False, chain=False)
    _arm_stack_dumps.handle = handle  # type: ignore[attr-defined]  (never closed)


# The flight recorder's variables, by the name torch >= 2.8 reads first.
FLIGHT_RECORDER_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_RECORDER_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def flight_recorder_fifo(run_dir: str, rank: str) -> str:
    return os.path.join(run_dir, STACKS_DIR, f"rank-{rank}.fr")


def flight_recorder_target(environ: "dict[str, str] | os._Environ", rank: str) -> str | None:
    """Where torch dumps rank ``rank``'s flight recorder; None where it is off."""
    size = next((environ[name] for name in FLIGHT_RECORDER_BUFFER if environ.get(name)), "0")
    prefix = next((environ[name] for name in FLIGHT_RECORDER_FILE if environ.get(name)), None)
    return f"{prefix}{rank}" if prefix and size.strip().isdigit() and int(size) > 0 else None


def _arm_flight_recorder_dumps() -> None:
    """A daemon thread that dumps the recorder each time the rank's FIFO is written."""
    import threading

    rank = os.environ.get("RANK")
    target = flight_recorder_target(os.environ, rank) if rank is not None else None
    if target is None:
        return
    fifo = flight_recorder_fifo(run_dir(), rank)
    try:
        os.makedirs(os.path.dirname(fifo), mode=0o700, exist_ok=True)
        if os.path.lexists(fifo):
            os.unlink(fifo)
        os.mkfifo(fifo, 0o600)
    except OSError:
        return
    threading.Thread(target=_serve_flight_recorder, args=(fifo, target), daemon=True,
                     name="ddp-orch-flight-recorder").start()


def _serve_flight_recorder(fifo: str, target: str) -> None:
    while True:
        try:
            with open(fifo, "rb") as fh:  # blocks until the node's agent opens it to write
                fh.read(64)
        except OSError:
            return
        dump_flight_recorder(target)


def dump_flight_recorder(target: str) -> bool:
    """Dump the flight recorder to ``target``, as torch does on a timeout;
    nothing before the program loads torch.distributed (the shim never does)."""
    c10d = sys.modules.get("torch._C._distributed_c10d")
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):  # torch >= 2.8 records gloo too
        dump = getattr(c10d, name, None)
        try:
            data = dump() if dump is not None else None
        except Exception:  # noqa: BLE001 (a recorder that cannot dump says nothing)
            data = None
        if data:
            try:
                with open(target + ".tmp", "wb") as fh:
                    fh.write(data)
                os.replace(target + ".tmp", target)
            except OSError:
                return False
            return True
    return False


def _user_frames(tb):
    """The traceback from the first frame that is not this module's or runpy's."""
    def ours(filename: str) -> bool:
        return filename in (__file__, os.path.abspath(__file__), runpy.__file__) or \
            filename.startswith("<frozen runpy")

    while tb is not None and ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def record_error(exc: BaseException, tb) -> None:
    """torchrun's error-file format, so its summary and ddp-orch's root cause quote it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {
        "message": f"{type(exc).__name__}: {exc}",
        "extraInfo": {"py_callstack": "".join(traceback.format_exception(type(exc), exc, tb)),
                      "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
    except OSError:
        pass


def _run_script(given: str, args: list[str]) -> None:
    """What ``python script.py ARGS`` does; ``runpy.run_path`` would make argv[0] absolute."""
    import builtins
    import importlib.machinery
    import types

    script = os.path.abspath(given)
    with open(script, "rb") as fh:
        source = fh.read()
    sys.argv = [given, *args]
    sys.path[0] = os.path.dirname(script)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=script, __cached__=None, __builtins__=builtins,
                           __loader__=importlib.machinery.SourceFileLoader("__main__", script))
    sys.modules["__main__"] = module
    exec(compile(source, script, "exec", dont_inherit=True), module.__dict__)


def _run_module(name: str, args: list[str]) -> None:
    """What ``python -m name ARGS`` does. The fresh ``__main__`` stays in
    ``sys.modules``: ``runpy.run_module`` would put the shim back, and a
    later pickle of a ``__main__`` class (in an atexit handler) would fail."""
    import builtins
    import importlib.util
    import types

    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{name}.__main__")
    if spec is None or spec.loader is None:
        raise ImportError(f"No module named {name}")
    code = spec.loader.get_code(spec.name)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=spec.origin, __cached__=spec.cached, __loader__=spec.loader,
                           __spec__=spec, __package__=spec.parent, __builtins__=builtins)
    sys.argv = [spec.origin or name, *args]
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


# The flight recorder's old names, dropped where torch knows the new ones
# (``plan/build.py`` sets both): torch >= 2.8 warns on every rank about the old.
FLIGHT_RECORDER_OLD = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
                       "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "TORCH_FR_DUMP_TEMP_FILE"}
FLIGHT_RECORDER_RENAMED_IN = (2, 8)


def _flight_recorder_names(environ: "dict[str, str] | os._Environ") -> None:
    """Drop an old flight-recorder variable its new name duplicates, where torch reads the new."""
    version = torch_version()
    try:
        major_minor = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except (AttributeError, ValueError):  # no torch found, or a version of another form
        return
    if major_minor < FLIGHT_RECORDER_RENAMED_IN:
        return
    for old, new in FLIGHT_RECORDER_OLD.items():
        if old in environ and environ.get(new) == environ[old]:
            del environ[old]


def torch_version() -> str | None:
    """The version of the torch this rank would import, from its ``version.py``:
    importing torch, or ``importlib.metadata`` (some 50 ms reading every
    installed package's metadata), would delay every rank's start."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("torch")  # not sys.modules: where torch is, not what ran
    for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("__version__"):
                        return line.rsplit("=", 1)[1].strip().strip("'\"")
        except OSError:
            continue
    return None


def main(argv: list[str]) -> int:
    if not argv or argv == ["-m"]:
        print("usage: python -m ddp_orch_shim (SCRIPT | -m MODULE) [ARGS...]", file=sys.stderr)
        return 2
    _arm_stack_dumps()
    _flight_recorder_names(os.environ)
    _arm_flight_recorder_dumps()
    try:
        if argv[0] == "-m":
            _run_module(argv[1], argv[2:])
        else:
            _run_script(argv[0], argv[1:])
    except (SystemExit, KeyboardInterrupt):
        raise  # exit codes and SIGINT's own ending, unchanged
    except BaseException as exc:  # noqa: BLE001 (reported, then the process ends with 1)
        tb = _user_frames(exc.__traceback__)
        exc = exc.with_traceback(tb)  # what Python would have printed: the user's frames
        record_error(exc, tb)
        if getattr(type(exc), ONE_LINE_ERROR, False) is True:
            sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
            sys.stderr.flush()
        else:
            sys.excepthook(type(exc), exc, tb)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
