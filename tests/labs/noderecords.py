"""A node's records for tests: a well-formed failure record."""

from __future__ import annotations



GOOD_PART = {"code": 1, "reason": "torchrun exited", "ended": "itself", "duration_s": 1.5, "last_lines": ["x"],
             "failures": [{"local_rank": 0, "message": "RuntimeError: boom",
                           "timestamp": 1795000000.5, "error_file": None}],
             "stop_asked": False, "stepped": True}
