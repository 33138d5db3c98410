"""Worker output for the node supervisor: torchrun's per-rank log files,
followed and turned into whole, rank-prefixed lines."""

from __future__ import annotations

import glob
import os
import time


class WorkerLogs:
    """Follows the per-rank files of ``torchrun --redirects``, not ``--tee``,
    whose tailer splits a line it reads mid-write in two. Here a partial last
    line waits for its newline, unless it stays partial for ``STALE_S`` (a
    progress bar redrawn with ``\r``)."""

    def __init__(self, log_dir: str, rdzv_id: str, first_rank: int, nproc: int):
        # torchrun's layout: <log-dir>/<rdzv-id>_<random>/attempt_<n>/<local rank>/
        self.pattern = os.path.join(log_dir, glob.escape(rdzv_id) + "_*", "attempt_0")
        self.first_rank = first_rank
        self.nproc = nproc
        self.files: list[_FollowedFile] = []

    def read(self, final: bool = False) -> bytes:
        if not self.files and self.nproc:
            found = glob.glob(self.pattern)
            if not found:
                return b""
            self.files = [_FollowedFile(os.path.join(found[0], str(i), name),
                                        f"[rank{self.first_rank + i}]: ".encode())
                          for i in range(self.nproc) for name in ("stdout.log", "stderr.log")]
        return b"".join(f.read(final) for f in self.files)


class _FollowedFile:
    STALE_S = 1.0
    MAX_PARTIAL = 1 << 20

    def __init__(self, path: str, prefix: bytes):
        self.path = path
        self.prefix = prefix
        self.fh = None
        self.partial = b""
        self.partial_since = 0.0

    def read(self, final: bool) -> bytes:
        if self.fh is None:
            try:
                self.fh = open(self.path, "rb", buffering=0)
            except FileNotFoundError:
                return b""
        data = self.partial + (self.fh.read(1 << 22) or b"")
        cut = data.rfind(b"\n") + 1
        now = time.monotonic()
        if cut or not self.partial:
            self.partial_since = now  # the bytes after ``cut`` are a new partial line
        stale = now - self.partial_since >= self.STALE_S
        if final or stale or len(data) - cut > self.MAX_PARTIAL:
            cut = len(data)
        block, self.partial = data[:cut], data[cut:]
        if not block:
            return b""
        if not block.endswith(b"\n"):
            block += b"\n"
        # A line that already carries this rank's prefix keeps just the one:
        # torch.distributed's excepthook (installed by init_process_group)
        # writes every traceback line as ``[rankN]: ...`` itself.
        lines = (b"\n" + block[:-1]).replace(b"\n" + self.prefix, b"\n")
        return lines.replace(b"\n", b"\n" + self.prefix)[1:] + b"\n"
