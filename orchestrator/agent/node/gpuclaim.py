"""A node's part in a launch's GPUs: what it has, what the run gets, held.

The controller asks every node at once, before anything starts. The chosen
GPUs stay locked for the run's whole life; the locks pass to the guardian
and a kept run's keeper, which outlive a SIGKILLed agent, and go with the
last descriptor: nothing to clean up.

torch is asked too (``TorchProbe``), in a child started first thing so its
import overlaps the uploads, for ``device: auto``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from . import gpulocks, gpus, probes
from .holdings import Holdings

SMI_TIMEOUT_S = 20.0  # each nvidia-smi query; a hung driver answers never
CLAIM_TRIES = 3  # another run may take a GPU between our look and our lock
TORCH_TIMEOUT_S = 120.0  # a cold import of torch with CUDA on a slow disk
NOTE_CHARS = 240  # a note of nvidia-smi's own in the reply (the controller takes 256)

def claim(want: "list[int] | str", *, run_id: str, node_rank: int, busy_mib: int,
          allow_busy: bool = False, holdings: Holdings | None = None, rehearsal: bool = False,
          lock_dir: str | None = None, busy_util: int = gpus.DEFAULT_BUSY_UTIL,
          ignore: "list[str] | tuple[str, ...]" = (),
          exclude: "list[int] | tuple[int, ...]" = ()) -> dict:
    """``choose``'s answer for ``want``, locked into ``holdings`` if given,
    with every GPU (``held_by`` where another run holds it) and the driver.

    Without nvidia-smi a list goes as listed, unchecked and unlocked. A
    ``rehearsal`` (``device: cpu``) may list indices the node lacks: CPU processes.
    """
    found = gpus.facts(SMI_TIMEOUT_S)
    if not found["ok"]:
        return _without_smi(want, found)
    listing = found["gpus"]
    policy = {"busy_mib": busy_mib, "busy_util": busy_util, "ignore": tuple(ignore),
              "exclude": tuple(exclude)}
    if rehearsal and not isinstance(want, str):
        there = {gpu["index"] for gpu in listing}
        if any(k not in there for k in want):
            return _rehearsed(want, [k for k in want if k in there], run_id=run_id,
                              node_rank=node_rank, allow_busy=allow_busy, holdings=holdings,
                              lock_dir=lock_dir, **policy)
    directory = gpulocks.lock_dir(lock_dir)
    keys = {gpu["index"]: gpus.lock_key(gpu) for gpu in listing}
    said = [f"nvidia-smi: {note}"[:NOTE_CHARS] for note in found.get("notes") or ()]
    facts = {"gpus": [], "apps": found["apps"], "driver": found.get("driver"),
             "lock_dir": directory, **({"unreported": found["unreported"]}
                                       if found.get("unreported") else {}),
             **({"smi_notes": said} if said else {})}
    for _ in range(CLAIM_TRIES):
        held = gpulocks.held_by_others(list(keys.values()), run_id, directory)
        choice = gpus.choose(want, listing, found["apps"], threshold_mib=busy_mib, held=held,
                             allow_busy=allow_busy, busy_util=busy_util, ignore=ignore,
                             exclude=exclude)
        facts["gpus"] = [{**gpu, **({"held_by": held[keys[gpu["index"]]]}
                                    if keys[gpu["index"]] in held else {})} for gpu in listing]
        if choice["ok"]:
            choice["notes"] = said + choice["notes"]
        else:
            choice["error"] += "".join(f"; {note}" for note in said)
        if not choice["ok"] or holdings is None:
            return {**choice, **facts}
        try:
            holdings.gpu_locks.append(gpulocks.hold([keys[k] for k in choice["chosen"]],
                                        {"run_id": run_id, "node_rank": node_rank}, directory))
        except gpulocks.Held:
            continue  # taken since we looked: look again
        return {**choice, **facts}
    return {"ok": False, "reason": "held", "waitable": True, "free": [],
            "error": f"other runs kept taking these GPUs while this one chose ({CLAIM_TRIES} "
                     "tries)"}


def _rehearsed(want: list[int], real: list[int], **claiming) -> dict:
    """A CPU rehearsal's list where some indices name no GPU here: those run CPU processes."""
    answer = claim(real, **claiming) if real else {"ok": True, "notes": [], "gpus": []}
    if not answer["ok"]:
        return answer
    missing = [k for k in want if k not in real]
    return {**answer, "chosen": list(want), "uuids": [], "models": [],
            "notes": [*answer.get("notes", []),
                      f"a CPU rehearsal: GPU {','.join(map(str, missing))} is not on this node, "
                      "and its index runs a CPU process"]}


def _without_smi(want: "list[int] | str", found: dict) -> dict:
    if not found.get("absent"):
        return {"ok": False, "reason": "smi-failed", "waitable": False, "free": [],
                "error": f"nvidia-smi failed: {found['error']}"}
    if isinstance(want, str):
        return {"ok": False, "reason": "no-smi", "waitable": False, "free": [],
                "error": f"gpus: {want} needs nvidia-smi to see which GPUs there are and "
                         "which are free, and it is not on this node's PATH"}
    return {"ok": True, "chosen": list(want), "uuids": [], "models": [], "gpus": [],
            "smi": "absent",
            "notes": ["nvidia-smi is not on this node's PATH: GPUs "
                      f"{','.join(map(str, want))} are taken as listed, with no busy check "
                      "and no hold against other runs"]}


# torch's view, in a child of the node's Python: never imported here (the agent
# stays stdlib-only, and a torch that crashes cannot take the agent down), and
# for a CUDA build not imported at all. Importing torch takes seconds; what
# ``device: auto`` and the launch's checks need is quicker to ask: the CUDA
# version torch was built with (its version.py, read as text), what the driver
# says (``probes.DRIVER_PROBE``), torch's arch list and NCCL's version. A
# build this cannot read (no version.py, a ROCm build) is imported instead.
# With CUDA_DEVICE_ORDER=PCI_BUS_ID, index i is nvidia-smi's GPU i.
_TORCH = probes.DRIVER_PROBE + """\
import importlib.util
def from_text():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    where = list(spec.submodule_search_locations)[0]
    with open(os.path.join(where, "version.py")) as fh:
        text = fh.read()
    version = re.search(r"^__version__\\s*=\\s*'([^']+)'", text, re.M)
    cuda = re.search(r"^cuda\\s*(?::[^=]*)?=\\s*(?:'([^']+)'|None)", text, re.M)
    hip = re.search(r"^hip\\s*(?::[^=]*)?=\\s*'", text, re.M)
    if version is None or cuda is None or hip is not None:
        return None
    out = {"torch": version.group(1), "cuda": cuda.group(1), "available": False,
           "nccl": nccl_version()}
    if out["cuda"]:
        out.update(cuda_driver())
        out["arch"] = arch_list(where)
        major = int(out["cuda"].split(".")[0])
        if out.get("driver_cuda") and int(out["driver_cuda"].split(".")[0]) < major:
            out.update(available=False, why="its driver supports CUDA %s, older than the "
                       "CUDA %s torch was built with" % (out["driver_cuda"], out["cuda"]))
    return out
try:
    out = from_text()
except OSError:
    out = None
if out is None:
    import torch
    out = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "available": bool(torch.cuda.is_available())}
    if out["available"]:
        out["count"] = torch.cuda.device_count()
        if out["cuda"]:
            try:
                out["caps"] = ["%d.%d" % torch.cuda.get_device_capability(i)
                               for i in range(out["count"])]
                out["arch"] = torch.cuda.get_arch_list()
            except Exception:
                pass
print(json.dumps(out))
"""


class TorchProbe:
    """torch's view of this node's GPUs, asked in a child started at once."""

    def __init__(self, python: str = sys.executable) -> None:
        self.child = subprocess.Popen([python, "-c", _TORCH], env=probes.every_gpu_env(),
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)

    def result(self, timeout_s: float = TORCH_TIMEOUT_S) -> dict:
        """torch's answer, or ``{"ok": False, "error"}`` with the child's last line."""
        try:
            out, err = self.child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.communicate()
            return {"ok": False, "error": f"asking torch took over {timeout_s:g}s"}
        lines = out.strip().splitlines()
        if self.child.returncode == 0 and lines:
            try:
                return {"ok": True, **json.loads(lines[-1])}
            except ValueError:
                pass
        last = (err.strip().splitlines() or [f"exit {self.child.returncode}"])[-1]
        return {"ok": False, "error": last[-300:]}
