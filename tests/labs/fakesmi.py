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

Lab hosts share this machine's filesystem and pid space, so one stand-in
answers for all of them: for the host its SSH session came in on (the
server address, the 3rd field of ``$SSH_CONNECTION``), ``$FAKE_SMI_HOST``
when set, else ``"local"``; an address with no state of its own is
``"local"`` too (a test run from an SSH login is still local). A host's
state is its list of GPUs, or ``{"gpus": [...], "fail", "hang", "driver"}``
to break one host alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
from pathlib import Path

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


def ssh_lab_path_line(directory) -> str:
    """An sshd_config line for ``SshLab(extra_sshd=[...])``: every SSH session
    on the lab's hosts finds the stand-in in ``directory`` first."""
    return f"SetEnv PATH={directory}:/usr/local/bin:/usr/bin:/bin"


def _host(name: str, spec: "list | dict", token: str, fail: dict | None, hang: bool) -> dict:
    if isinstance(spec, list):
        spec = {"gpus": spec}
    host_token = f"{token}-{hashlib.sha256(name.encode()).hexdigest()[:4]}"
    return {"driver": spec.get("driver", DRIVER), "fail": spec.get("fail", fail),
            "hang": spec.get("hang", hang),
            "gpus": [_gpu(k, gpu, host_token) for k, gpu in enumerate(spec.get("gpus", []))]}


def _gpu(position: int, gpu: dict, token: str) -> dict:
    """A GPU with every value the stand-in prints; ``token`` makes the
    default UUID unique to this fake and host."""
    index = gpu.get("index", position)
    out = {"index": index, "uuid": f"GPU-{token}-4000-8000-{index:012x}",
           "bus_id": f"00000000:{0x18 + index:02X}:00.0", "name": MODEL,
           "memory_total": 81559, "memory_used": 0, "utilization": 0, "mig": False,
           "processes": []}
    out.update(gpu)
    out["processes"] = [{"name": "python", "used_mib": None, **p} for p in out["processes"]]
    return out


# The stand-in itself: stdlib only, run with -I.
_SCRIPT = r'''
import json
import os
import sys
import time

GPU_FIELDS = {
    "index": lambda g, h: g["index"],
    "uuid": lambda g, h: g["uuid"],
    "pci.bus_id": lambda g, h: g["bus_id"],
    "name": lambda g, h: g["name"],
    "memory.total": lambda g, h: g["memory_total"],
    "memory.used": lambda g, h: g["memory_used"],
    "utilization.gpu": lambda g, h: "[N/A]" if g["mig"] else g["utilization"],
    "mig.mode.current": lambda g, h: {True: "Enabled", False: "Disabled"}.get(g["mig"]),
    "driver_version": lambda g, h: h["driver"],
}
APP_FIELDS = {
    "gpu_uuid": lambda p, g: g["uuid"],
    "pid": lambda p, g: p["pid"],
    "process_name": lambda p, g: p["name"],
    "used_memory": lambda p, g: p["used_mib"],
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
                                                     "driver": ""}


def query(spec, table):
    fields = spec.split(",")
    bad = [f for f in fields if f not in table]
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
    args = dict(a.split("=", 1) if "=" in a else (a, "") for a in argv)
    if "-L" in args:
        for g in gpus:
            print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        return
    if args.get("--format") != "csv,noheader,nounits":
        print("fake nvidia-smi: only -L and --format=csv,noheader,nounits queries")
        sys.exit(2)
    if "--query-gpu" in args:
        getters = query(args["--query-gpu"], GPU_FIELDS)
        rows = [[get(g, host) for get in getters] for g in gpus]
    elif "--query-compute-apps" in args:
        getters = query(args["--query-compute-apps"], APP_FIELDS)
        rows = [[get(p, g) for get in getters] for g in gpus for p in g["processes"]]
    else:
        print("fake nvidia-smi: only -L, --query-gpu and --query-compute-apps")
        sys.exit(2)
    for row in rows:
        print(", ".join(map(value, row)))


main(sys.argv[1:])
'''
