"""ddp-orch's side of bench/fanout.py, run as its own process (python start included).

    python bench/_fanout_worker.py HOST...      (HOME pointing at the lab home)

Connects to every host and runs ``true`` there, all at once, with the
project's own code path: ``orchestrator.engine.fanout.on_all`` (the helper
launch, check and down use for every node at once) over
``SshTransport(host).run(["true"])`` (paramiko; settings from ~/.ssh/config,
strict host keys), connection setup included; then closes the connections. Prints
one JSON line: import, fan-out and close times, peak RSS.
"""

from __future__ import annotations

import json
import sys
import time

T0 = time.perf_counter()

from orchestrator.engine.fanout import on_all  # noqa: E402

T_IMPORTED = time.perf_counter()


def vm(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def main(hosts: list[str]) -> None:
    from orchestrator.transport.ssh import SshTransport  # paramiko: counted apart

    t_paramiko = time.perf_counter()
    transports = {h: SshTransport(h) for h in hosts}
    failures = []

    def one(host: str) -> None:
        result = transports[host].run(["true"], timeout=60)
        if not result.ok:
            failures.append((host, result.exit_code, result.output[-200:]))

    t1 = time.perf_counter()
    on_all(one, hosts).values("fan-out")
    t2 = time.perf_counter()
    for t in transports.values():
        t.close()
    t3 = time.perf_counter()
    print(json.dumps({"import_s": T_IMPORTED - T0, "paramiko_import_s": t_paramiko - T_IMPORTED,
                      "fanout_s": t2 - t1, "close_s": t3 - t2, "hosts": len(hosts),
                      "failures": failures, "vm_hwm_kib": vm("VmHWM"), "vm_rss_kib": vm("VmRSS"),
                      "threads_peak_hint": len(hosts)}))


if __name__ == "__main__":
    main(sys.argv[1:])
