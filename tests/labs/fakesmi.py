"""Fake nvidia-smis for tests of GPU refusals and of GPU choice.

``fake_smi`` is the simplest: an ``nvidia-smi`` that lists GPUs for ``-L``.
``fake_nvidia_smi`` is a programmable stand-in: an executable Python
script that reads a JSON state file on every call, so a test changes the
GPUs between calls with ``set_state``. It answers ``-L``,
``--query-gpu=FIELDS`` and ``--query-compute-apps=FIELDS`` (with
``--format=csv,noheader,nounits``) for any subset and order of
``gpus.GPU_FIELDS`` and ``gpus.APP_FIELDS``, as the real one does: values
joined by ``", "``, ``[N/A]`` where unknown, and exit 6 with "No devices
were found" when there is no GPU.

A GPU is a dict; every key is optional: ``index`` (its place in the list),
``uuid`` (unique to this fake: a random token, so two tests never share a
lock key), ``bus_id``, ``name``, ``memory_total``, ``memory_used``,
``utilization`` (MiB and percent; None is ``[N/A]``, a string is printed
as it is), ``mig`` (True, False, or None for a GPU without MIG), and
``processes``: ``[{"pid", "used_mib", "name"}]`` with pids the test gives.

Its health, as the driver reports it (each printed as nvidia-smi prints
it): ``ecc_errors`` (uncorrected since the driver loaded; None for a GPU
without ECC), ``retired_pending`` and ``reset_required`` (Yes/No),
``compute_mode`` (``Default``, ``Exclusive_Process``, ``Prohibited``),
``throttle`` (the active clock event reasons' bits, printed in hex), and
``remapped_pending``/``remapped_failed`` (``--query-remapped-rows``, 0/1;
None: a GPU before Ampere, ``[N/A]``). Its faults: ``fault: "reset"``
prints ``[GPU requires reset]`` in place of its values (``"lost"``: ``[GPU
is lost]``); ``off_bus: True`` prints "Unable to determine the device
handle for GPU<bus id>: Unknown Error" in place of its line and makes
every query exit 15; ``inforom: True`` prints "WARNING: infoROM is
corrupted at gpu <bus id>" after the rows and makes every query exit 14;
``garbled: TEXT`` prints TEXT in place of its line.

Lab hosts share this machine's filesystem and pid space, so one stand-in
answers for all of them: for the host its SSH session came in on (the
server address, the 3rd field of ``$SSH_CONNECTION``), ``$FAKE_SMI_HOST``
when set, else ``"local"``; an address with no state of its own is
``"local"`` too (a test run from an SSH login is still local). A host's
state is its list of GPUs, or ``{"gpus": [...], "fail", "hang", "driver",
"unknown_fields"}`` to break one host alone; ``unknown_fields`` are fields
it refuses as an older nvidia-smi does ('Field "X" is not a valid field to
query.', exit 2).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
from pathlib import Path

import pytest

LOCAL = ("up", "--local")
STATE = "nvidia-smi.json"
DRIVER = "550.54.15"
MODEL = "NVIDIA H100 80GB HBM3"


def fake_smi(directory, *indices: int) -> str:
    """A directory holding an ``nvidia-smi`` that lists idle GPUs ``indices``."""
    return fake_nvidia_smi(directory, [{"index": k} for k in indices])


def fake_nvidia_smi(directory, hosts: "dict[str, list | dict] | list[dict]", *,
                    fail: dict | None = None, hang: bool = False) -> str:
    """Write the stand-in ``nvidia-smi`` and its state into ``directory``;
    the directory, to put first on ``PATH``.

    ``hosts`` maps a host (``"local"``, a lab host's address) to its GPUs; a
    plain list is ``"local"``'s. ``fail`` (``{"code": 9, "message": ...}``)
    makes every call print the message and exit with the code; ``hang``
    makes every call sleep for an hour.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text(f"#!{sys.executable} -I\n"
                      f"STATE = {str(directory / STATE)!r}\n" + _SCRIPT)
    script.chmod(0o755)
    set_state(directory, hosts, fail=fail, hang=hang)
    return str(directory)


def set_state(directory, hosts: "dict[str, list | dict] | list[dict]", *,
              fail: dict | None = None, hang: bool = False) -> dict:
    """Replace the stand-in's state (atomically: a call under way reads the
    old or the new one); the state as written, defaults filled in, so a test
    reads its GPUs' UUIDs from it. A UUID left out stays what it was."""
    directory = Path(directory)
    old = state(directory) if (directory / STATE).exists() else {}
    token = old.get("token") or secrets.token_hex(4)
    if isinstance(hosts, list):
        hosts = {"local": hosts}
    new = {"token": token,
           "hosts": {name: _host(name, spec, token, fail, hang) for name, spec in hosts.items()}}
    tmp = directory / (STATE + ".tmp")
    tmp.write_text(json.dumps(new, indent=1))
    os.replace(tmp, directory / STATE)
    return new


def state(directory) -> dict:
    """The stand-in's state as it stands."""
    return json.loads((Path(directory) / STATE).read_text())


@pytest.fixture
def smi_on_path(tmp_path, monkeypatch):
    """``fake(hosts, ...)``: the stand-in, first on PATH for this test, as
    this machine's (``"local"``) whatever SSH session the tests run in."""
    def fake(hosts, **kwargs):
        directory = fake_nvidia_smi(tmp_path / "smi", hosts, **kwargs)
        monkeypatch.setenv("PATH", directory + os.pathsep + os.environ["PATH"])
        monkeypatch.delenv("SSH_CONNECTION", raising=False)
        monkeypatch.delenv("FAKE_SMI_HOST", raising=False)
        return directory
    return fake


def ssh_lab_path_line(directory) -> str:
    """An sshd_config line for ``SshLab(extra_sshd=[...])``: every SSH session
    on the lab's hosts finds the stand-in in ``directory`` first."""
    return f"SetEnv PATH={directory}:/usr/local/bin:/usr/bin:/bin"


def _host(name: str, spec: "list | dict", token: str, fail: dict | None, hang: bool) -> dict:
    if isinstance(spec, list):
        spec = {"gpus": spec}
    host_token = f"{token}-{hashlib.sha256(name.encode()).hexdigest()[:4]}"
    return {"driver": spec.get("driver", DRIVER), "fail": spec.get("fail", fail),
            "hang": spec.get("hang", hang), "unknown_fields": spec.get("unknown_fields", []),
            "gpus": [_gpu(k, gpu, host_token) for k, gpu in enumerate(spec.get("gpus", []))]}


def _gpu(position: int, gpu: dict, token: str) -> dict:
    """A GPU with every value the stand-in prints; ``token`` makes the
    default UUID unique to this fake and host."""
    index = gpu.get("index", position)
    out = {"index": index, "uuid": f"GPU-{token}-4000-8000-{index:012x}",
           "bus_id": f"00000000:{0x18 + index:02X}:00.0", "name": MODEL,
           "memory_total": 81559, "memory_used": 0, "utilization": 0, "mig": False,
           "ecc_errors": 0, "retired_pending": False, "reset_required": False,
           "compute_mode": "Default", "throttle": 0, "remapped_pending": False,
           "remapped_failed": False, "processes": []}
    out.update(gpu)
    out["processes"] = [{"name": "python", "used_mib": None, **p} for p in out["processes"]]
    return out


# The stand-in itself: stdlib only, run with -I.
_SCRIPT = r'''
import json
import os
import sys
import time

FAULTS = {"reset": "[GPU requires reset]", "lost": "[GPU is lost]"}


def yes_no(v):
    return None if v is None else ("Yes" if v else "No")


def gpu_value(key, fmt=lambda v: v):
    def get(g, h):
        if g.get("fault") in FAULTS and key not in ("index", "uuid", "bus_id", "name", "mig"):
            return FAULTS[g["fault"]]
        return fmt(g[key])
    return get


GPU_FIELDS = {
    "index": gpu_value("index"),
    "uuid": gpu_value("uuid"),
    "pci.bus_id": gpu_value("bus_id"),
    "name": gpu_value("name"),
    "memory.total": gpu_value("memory_total"),
    "memory.used": gpu_value("memory_used"),
    "utilization.gpu": lambda g, h: "[N/A]" if g["mig"] else gpu_value("utilization")(g, h),
    "mig.mode.current": lambda g, h: {True: "Enabled", False: "Disabled"}.get(g["mig"]),
    "driver_version": lambda g, h: h["driver"],
    "ecc.errors.uncorrected.volatile.total": gpu_value("ecc_errors"),
    "retired_pages.pending": gpu_value("retired_pending", yes_no),
    "reset_status.reset_required": gpu_value("reset_required", yes_no),
    "compute_mode": gpu_value("compute_mode"),
    "clocks_throttle_reasons.active": gpu_value("throttle", lambda v: f"0x{v:016x}"),
    "clocks_event_reasons.active": gpu_value("throttle", lambda v: f"0x{v:016x}"),
}
APP_FIELDS = {
    "gpu_uuid": lambda p, g: g["uuid"],
    "pid": lambda p, g: p["pid"],
    "process_name": lambda p, g: p["name"],
    "used_memory": lambda p, g: p["used_mib"],
}
ROW_FIELDS = {
    "gpu_uuid": lambda g: g["uuid"],
    "gpu_bus_id": lambda g: g["bus_id"],
    "remapped_rows.pending": lambda g: None if g["remapped_pending"] is None
    else int(g["remapped_pending"]),
    "remapped_rows.failure": lambda g: None if g["remapped_failed"] is None
    else int(g["remapped_failed"]),
}


def value(v):
    return "[N/A]" if v is None else str(v)


def host_state():
    with open(STATE) as f:
        hosts = json.load(f)["hosts"]
    name = os.environ.get("FAKE_SMI_HOST")
    if not name:
        conn = os.environ.get("SSH_CONNECTION", "").split()
        name = conn[2] if len(conn) > 2 else "local"
    return hosts.get(name) or hosts.get("local") or {"gpus": [], "fail": None, "hang": False,
                                                     "driver": "", "unknown_fields": []}


def query(spec, table, unknown):
    fields = spec.split(",")
    bad = [f for f in fields if f not in table or f in unknown]
    if bad:
        print(f'Field "{bad[0]}" is not a valid field to query.')
        sys.exit(2)
    return [table[f] for f in fields]


def main(argv):
    host = host_state()
    if host["hang"]:
        time.sleep(3600)
    if host["fail"]:
        print(host["fail"]["message"])
        sys.exit(host["fail"]["code"])
    gpus = host["gpus"]
    if not gpus:
        print("No devices were found")
        sys.exit(6)
    unknown = host.get("unknown_fields") or []
    args = dict(a.split("=", 1) if "=" in a else (a, "") for a in argv)
    code = 15 if any(g.get("off_bus") for g in gpus) else \
        14 if any(g.get("inforom") for g in gpus) else 0
    reachable = [g for g in gpus if not g.get("off_bus")]
    lost = [f"Unable to determine the device handle for GPU{g['bus_id']}: Unknown Error"
            for g in gpus if g.get("off_bus")]
    if "-L" in args:
        for g in reachable:
            print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        for line in lost:
            print(line)
        sys.exit(code)
    if args.get("--format") != "csv,noheader,nounits":
        print("fake nvidia-smi: only -L and --format=csv,noheader,nounits queries")
        sys.exit(2)
    out = []
    if "--query-gpu" in args:
        getters = query(args["--query-gpu"], GPU_FIELDS, unknown)
        for g in gpus:
            if g.get("off_bus"):
                out.append(f"Unable to determine the device handle for GPU{g['bus_id']}: "
                           "Unknown Error")
            elif g.get("garbled"):
                out.append(g["garbled"])
            else:
                out.append(", ".join(value(get(g, host)) for get in getters))
    elif "--query-compute-apps" in args:
        getters = query(args["--query-compute-apps"], APP_FIELDS, unknown)
        out = [", ".join(value(get(p, g)) for get in getters)
               for g in reachable for p in g["processes"]]
    elif "--query-remapped-rows" in args:
        getters = query(args["--query-remapped-rows"], ROW_FIELDS, unknown)
        out = [", ".join(value(get(g)) for get in getters) for g in reachable]
    else:
        print("fake nvidia-smi: only -L, --query-gpu, --query-compute-apps and "
              "--query-remapped-rows")
        sys.exit(2)
    out += [f"WARNING: infoROM is corrupted at gpu {g['bus_id']}" for g in gpus if g.get("inforom")]
    for line in out:
        print(line)
    sys.exit(code)


main(sys.argv[1:])
'''
