"""What a node supervisor runs, typed: ``SupervisorSpec``, and who owns its run.

It is checked on arrival like every other message: a bad spec is a
``SpecError`` naming the field, never a KeyError halfway through a run.
"""

from __future__ import annotations

import dataclasses

from ..wire import fields
from ..wire.owner import Owner, OwnerError


class SpecError(ValueError):
    """A supervisor spec that is not one: what is wrong, by field."""


@dataclasses.dataclass(frozen=True)
class SupervisorSpec:
    run_id: str
    node_rank: int
    run_dir: str
    argv: tuple[str, ...]  # torchrun's, the dry-run's word for word
    env: dict[str, str]  # set over the node's environment
    unset_env: tuple[str, ...] = ()  # removed from it first
    cwd: str | None = None  # torchrun's working directory (the code root); else run_dir
    first_rank: int = 0
    nproc: int = 0
    master_port: int = 0  # 0: not known here (no "joined" milestone)
    bundle: str | None = None  # the code bundle to unpack in run_dir, if any
    grace_s: float = 10.0  # SIGTERM to SIGKILL
    heartbeat_s: float | None = None  # a heartbeat event this often (None: none)
    secrets: tuple[str, ...] = ()  # values masked in what the node keeps and sends
    # ``setup:`` (``nodesetup.py``): {"commands": [[argv]], "cwd", "timeout_s", "path_first",
    # "when_changed": {"paths", "env"} or absent (``setupstamp.py``: skipped while unchanged)}
    setup: dict | None = None
    log_dir: str | None = None  # torchrun's --log-dir (a keeper's attempt: its own); else run_dir/torchrun
    # Who owns the run (``wire/owner.py``), as the dry-run decided it; the
    # supervisor asks it: does the controller ping on stdin (``pings``), or
    # do keepers handle the signals (``keepers_hold``)? Else a scheduler's
    # signals (scancel, srun --kill-on-bad-exit) are the stop.
    owner: Owner = Owner()

    def to_dict(self) -> dict:
        """The JSON form (``from_dict`` reads it back)."""
        out = dataclasses.asdict(self)
        out.update(argv=list(self.argv), unset_env=list(self.unset_env),
                   secrets=list(self.secrets), owner=self.owner.to_json())
        return out

    @classmethod
    def from_dict(cls, data: object) -> "SupervisorSpec":
        """A spec from its JSON form, every field checked; SpecError if it is not one."""
        try:
            return cls._from_dict(data)
        except SpecError as exc:
            raise SpecError(f"bad supervisor spec: {exc}") from None

    @classmethod
    def _from_dict(cls, data: object) -> "SupervisorSpec":
        if not isinstance(data, dict):
            raise SpecError(f"not an object: {str(data)[:200]}")
        unknown = fields.unknown(data, _FIELDS)
        if unknown:
            raise SpecError(f"unknown field(s) {', '.join(map(repr, unknown))}")
        missing = [name for name in _FIELDS if not name.endswith("?") and name not in data]
        if missing:
            raise SpecError(f"missing field(s) {', '.join(map(repr, missing))}")
        why = fields.why_bad(data, _FIELDS)
        if why is not None:
            raise SpecError(why)
        given = dict(data)
        if "owner" in given:
            try:
                given["owner"] = Owner.from_json(given["owner"])
            except OwnerError as exc:
                raise SpecError(f"'owner': {exc}") from None
        for name in ("argv", "unset_env", "secrets"):
            if name in given:
                given[name] = tuple(given[name])
        return cls(**given)


def _setup(value: object) -> bool:
    return isinstance(value, dict) \
        and set(value) <= {"commands", "cwd", "timeout_s", "path_first", "when_changed"} \
        and isinstance(value.get("commands"), list) \
        and all(fields.STRINGS.check(c) for c in value["commands"]) \
        and isinstance(value.get("cwd"), str) and _SECONDS.check(value.get("timeout_s")) \
        and _OPTIONAL_TEXT.check(value.get("path_first")) \
        and (value.get("when_changed") is None or _when_changed(value["when_changed"]))


def _when_changed(value: object) -> bool:
    """``{paths: [file under the code root], env: [name]}`` (``setupstamp.py``)."""
    return isinstance(value, dict) and set(value) == {"paths", "env"} \
        and fields.STRINGS.check(value["paths"]) and bool(value["paths"]) \
        and fields.STRINGS.check(value["env"])


_SECONDS = fields.seconds()
_OPTIONAL_TEXT = fields.optional(fields.TEXT)
_RANK = fields.count(0, "a rank (0 or more)")
# Every field of a spec, as ``fields.first_bad`` reads it ("?": may be absent).
_FIELDS = {
    "run_id": fields.TEXT, "node_rank": _RANK, "run_dir": fields.PATH,
    "argv": fields.COMMAND, "env": fields.ENV,
    "unset_env?": fields.Field(fields.STRINGS.check, "a list of variable names"),
    "cwd?": fields.Field(_OPTIONAL_TEXT.check, "a directory path or null"),
    "first_rank?": _RANK, "nproc?": fields.count(0), "master_port?": fields.PORT,
    "bundle?": fields.Field(_OPTIONAL_TEXT.check, "a file name or null"),
    "grace_s?": _SECONDS,
    "heartbeat_s?": fields.optional(fields.seconds(positive=True)),
    "secrets?": fields.STRINGS,
    "setup?": fields.Field(lambda v: v is None or _setup(v), "{commands: [[argv]], cwd, "
                           "timeout_s, path_first, when_changed} or null"),
    "log_dir?": fields.Field(_OPTIONAL_TEXT.check, "a directory path or null"),
    "owner?": fields.RECORD,  # checked whole by ``Owner.from_json``
}
