"""How the agent reaches a node: a few lines of Python, then the package over stdin.

BOOT imports the package from memory: nothing is written to or installed on
the node, and a remote shell's start overlaps the controller's other work.
It reads stdin raw and to the exact size, so the agent finds its requests
untouched; EOF before the source means the launch was abandoned.
"""

from __future__ import annotations

import functools
import json
import os
import zlib

from .protocol import digest

PACKAGE = "ddp_orch_agent"

BOOT = r"""import hashlib, importlib.machinery, json, linecache, os, sys, zlib
def take(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data
head = b""
while not head.endswith(b"\n"):
    head += take(1)
head = json.loads(head)
blob = take(head["size"])
if hashlib.sha256(blob).hexdigest() != head["sha256"]:
    sys.exit("ddp-orch: the agent arrived corrupted (checksum mismatch)")
SOURCES = json.loads(zlib.decompress(blob))
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name in SOURCES:
            package = any(k.startswith(name + ".") for k in SOURCES)
            return importlib.machinery.ModuleSpec(name, self, is_package=package)
    def create_module(self, spec):
        return None
    def get_source(self, name):
        return SOURCES[name]
    def exec_module(self, module):
        name = "<ddp-orch agent>/" + module.__name__.replace(".", "/") + ".py"
        source = SOURCES[module.__name__]
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        exec(compile(source, name, "exec"), module.__dict__)
sys.meta_path.insert(0, Finder())
from ddp_orch_agent.__main__ import main
sys.exit(main(head["argv"]))
"""



def sources() -> dict[str, str]:
    """This package's modules by the names they get on the node (``__init__`` as its package)."""
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = {}
    for folder, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if os.path.isfile(os.path.join(folder, d, "__init__.py")))
        parts = [PACKAGE, *os.path.relpath(folder, top).split(os.sep)]
        parts = [p for p in parts if p != "."]
        for name in sorted(n for n in names if n.endswith(".py")):
            module = ".".join(parts if name == "__init__.py" else [*parts, name[:-3]])
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                out[module] = fh.read()
    return out


@functools.cache
def _blob() -> bytes:
    """This package's sources, compressed: the same for every node of a launch."""
    return zlib.compress(json.dumps(sources()).encode(), 6)


def payload(argv: list[str]) -> bytes:
    """What to write to BOOT's stdin to run the agent with ``argv``."""
    blob = _blob()
    head = {"size": len(blob), "sha256": digest(blob), "argv": argv}
    return json.dumps(head).encode() + b"\n" + blob


ZIPAPP_MAIN = "from ddp_orch_agent.__main__ import main\nimport sys\nsys.exit(main(sys.argv[1:]))\n"


def zipapp(path: str, cache_dir: str | None = None) -> str:
    """Write this package as a zipapp for nodes a scheduler starts from a
    shared directory; returns its SHA-256. Each module goes with a checked
    hash-based ``.pyc``, so a node running this Python skips compiling
    (about 0.1 s of its start)."""
    modules = sources()
    key = digest(json.dumps(modules, sort_keys=True).encode() + _magic())[:24]
    cache_dir = zipapp_cache_dir() if cache_dir is None else cache_dir
    cached = _read_cached(cache_dir, key) if cache_dir else None
    if cached is None:
        data = _build_zipapp(modules)
        cached = data, digest(data)
        if cache_dir:
            try:
                os.makedirs(cache_dir, mode=0o700, exist_ok=True)
                _write_atomically(os.path.join(cache_dir, _cached_name(key, cached[1])), data)
            except OSError:
                pass
    _write_atomically(path, cached[0])
    return cached[1]


def zipapp_cache_dir(env: dict | None = None) -> str:
    """``$XDG_CACHE_HOME/ddp-orch``, else ``~/.cache/ddp-orch``; "" without a home."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        base = os.path.join(home, ".cache") if os.path.isabs(home) else ""
    return os.path.join(base, "ddp-orch") if base else ""


def _magic() -> bytes:
    import importlib.util

    return importlib.util.MAGIC_NUMBER


def _cached_name(key: str, sha256: str) -> str:
    """A cached archive's name: its sources' and Python's ``key``, then its own digest."""
    return f"agent-{key}-{sha256[:32]}.pyz"


def _read_cached(cache_dir: str, key: str) -> tuple[bytes, str] | None:
    """A cached archive of these sources for this Python, and its digest, if
    its bytes are the ones its name records: one cut short, damaged or edited
    is not used (and is written again). A digest, not a read of every member:
    ~2 ms, not ~30."""
    try:
        names = sorted(n for n in os.listdir(cache_dir) if n.startswith(f"agent-{key}-"))
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(cache_dir, name), "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        sha256 = digest(data)
        if name == _cached_name(key, sha256):
            return data, sha256
    return None


def _entries(modules: dict[str, str]) -> dict[str, bytes]:
    """The archive's sources by their names in it, ``__main__.py`` included."""
    out = {}
    for name, source in modules.items():
        package = any(k.startswith(name + ".") for k in modules)
        out[name.replace(".", "/") + ("/__init__.py" if package else ".py")] = \
            source.encode("utf-8")
    return {**out, "__main__.py": ZIPAPP_MAIN.encode("utf-8")}


def _build_zipapp(modules: dict[str, str]) -> bytes:
    import importlib.util
    import io
    import marshal
    import zipfile

    stamp = (1980, 1, 1, 0, 0, 0)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for inner, raw in _entries(modules).items():
            zf.writestr(zipfile.ZipInfo(inner, stamp), raw)
            if inner == "__main__.py":  # run as the archive's script: never imported
                continue
            code = compile(raw, "agent.pyz/" + inner, "exec", dont_inherit=True)
            # PEP 552: magic, flags 0b11 (hash-based, checked), the source's hash, the code
            zf.writestr(zipfile.ZipInfo(inner + "c", stamp),
                        _magic() + (0b11).to_bytes(4, "little")
                        + importlib.util.source_hash(raw) + marshal.dumps(code))
    return buffer.getvalue()


def _write_atomically(path: str, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all: two controllers may write one."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as fh:
        fh.write(data)
    os.replace(temporary, path)


def command(python: str) -> list[str]:
    """The argv that starts BOOT on a node. ``-I -S``: the agent needs only
    the standard library, so a node's sitecustomize, a stray ``PYTHONPATH``
    or a package shadowing a stdlib module cannot change what it does."""
    return [python, "-I", "-S", "-c", BOOT]
