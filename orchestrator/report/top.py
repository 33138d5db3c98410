"""``ddp-orch top``: every rank of a live run on one screen, built from what
``status`` reads, with no channel of its own. Rates come from the frames before;
an ended run shows its mean rates over the run."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..tables import format_table
from .pace import PaceWindow, Straggler, paces, stragglers

if TYPE_CHECKING:
    from ..records.store import RunRecord

NARROW = 100  # columns below which each rank is one line of words, not a table row


@dataclass(frozen=True)
class RankRow:
    """One rank in a frame; None where nothing was reported."""

    rank: int
    node_rank: int | None
    host: str | None
    gpu: int | None
    gpu_model: str | None
    step: int | None
    steps_per_s: float | None
    samples_per_s: float | None
    last_progress_s_ago: float | None
    compute_s: float | None
    data_s: float | None
    gpu_util: int | None
    gpu_mem_mib: int | None
    silent: bool  # it never reported progress: shown, never marked
    straggler: str | None  # why it holds the gang back, where it does


@dataclass(frozen=True)
class TopFrame:
    """One refresh: the run, its ranks, the gang's throughput, the slowest rank."""

    run_id: str
    state: str
    owner: str
    attempt: int
    elapsed_s: float | None
    world_size: int | None
    ranks: tuple[RankRow, ...]
    samples_per_s: float | None
    steps_per_s: float | None
    slowest: Straggler | None
    ended: str  # how the run ended ("" while live)
    ended_at: float | None = None  # when (None while live, or unknown)
    # what the rates are over: "window" (the last seconds), "mean" (the run,
    # its ranks' reports), "result" (the run, rank 0's result's own timing)
    rates: str = "window"

    @property
    def live(self) -> bool:
        return not self.ended

    def to_json(self) -> dict[str, Any]:
        """The frame as ``top --json`` prints it (``schema/top.schema.json``)."""
        out = asdict(self)
        out["ranks"] = [asdict(r) for r in self.ranks]
        out["slowest"] = None if self.slowest is None else asdict(self.slowest)
        return out


def build_frame(record: RunRecord, rows: Sequence[dict[str, Any]], window: PaceWindow,
                now: float | None = None, attempts: Sequence[object] = (),
                attempt: int | None = None) -> TopFrame:
    """A frame of ``record`` from its ranks' rows, added to ``window`` first."""
    now = time.time() if now is None else now
    for row in rows:  # a rate is over the step reports' own times
        ago = row.get("last_step_s_ago")
        if ago is not None:
            window.add(now - ago, row["rank"], row.get("step"), row.get("samples"))
    mean = any("mean_steps_per_s" in row for row in rows)  # an ended run's (final_progress)
    marked = [] if mean else stragglers(paces(rows, window))
    why = {s.rank: s.why for s in marked}
    plan = record.run.plan()
    models = _gpu_models(plan)
    ranks = tuple(RankRow(
        rank=row["rank"], node_rank=row.get("node_rank"), host=row.get("host"),
        gpu=row.get("gpu"), gpu_model=models.get((row.get("node_rank"), row.get("gpu"))),
        step=row.get("step"),
        steps_per_s=_rounded(row.get("mean_steps_per_s"), 3) if mean else window.rate(row["rank"]),
        samples_per_s=_rounded(row.get("mean_samples_per_s"), 1) if mean
        else window.samples_rate(row["rank"]),
        last_progress_s_ago=row.get("last_progress_s_ago"),
        compute_s=row.get("compute_s"), data_s=row.get("data_s"),
        gpu_util=row.get("gpu_util"), gpu_mem_mib=row.get("gpu_mem_mib"),
        silent=row.get("last_progress_s_ago") is None, straggler=why.get(row["rank"]))
        for row in rows)
    world = plan.get("world_size") if isinstance(plan, dict) else None
    rates = [r.samples_per_s for r in ranks if r.samples_per_s is not None]
    steps = [r.steps_per_s for r in ranks if r.steps_per_s is not None]
    gang = (round(sum(rates), 1) if rates else None, round(min(steps), 3) if steps else None)
    kind = "mean" if mean else "window"
    if not record.live and gang == (None, None):  # no ranks kept: rank 0's own timing
        gang, kind = _result_rates(record), "result"
    end = record.ended if record.ended is not None else now
    return TopFrame(
        run_id=record.run_id, state=str(record.state), owner=str(record.owner),
        attempt=attempt if attempt is not None else max(0, len(attempts or record.attempts) - 1),
        elapsed_s=None if record.started is None else round(max(0.0, end - record.started), 1),
        world_size=world if isinstance(world, int) else None, ranks=ranks,
        samples_per_s=gang[0], steps_per_s=gang[1],
        slowest=marked[0] if marked else None,
        ended="" if record.live else _ended(record),
        ended_at=None if record.live else record.ended,
        rates="window" if record.live else kind)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _result_rates(record: RunRecord) -> tuple[float | None, float | None]:
    """The gang's samples and steps per second over the run, from rank 0's result."""
    result = record.run.result()
    timing = result.get("timing") if isinstance(result, dict) else None
    if not isinstance(timing, dict):
        return None, None
    samples, steps, train = (timing.get(k) for k in ("samples_per_s", "steps", "train_s"))
    number = (int, float)
    return (round(samples, 1) if isinstance(samples, number) and samples >= 0 else None,
            round(steps / train, 3) if isinstance(steps, number) and isinstance(train, number)
            and train > 0 and steps >= 0 else None)


def _gpu_models(plan: Any) -> dict[tuple[int, int], str]:
    """(node rank, GPU index) -> the model the launch recorded."""
    out = {}
    for node in (plan.get("nodes") or ()) if isinstance(plan, dict) else ():
        gpus, models = node.get("gpus"), node.get("gpu_models")
        if isinstance(gpus, list) and isinstance(models, list):
            out.update({(node.get("node_rank"), g): m for g, m in zip(gpus, models)
                        if isinstance(m, str)})
    return out


def _ended(record: RunRecord) -> str:
    cause = record.root_cause
    why = f": node {cause.node_rank} ({cause.host}) {cause.reason}" if cause else \
        (f": {record.error}" if record.error else "")
    return f"{record.state}{why}"


# -- text ---------------------------------------------------------------------

def render(frame: TopFrame, width: int = 120, height: int = 50,
           mark=lambda text: text) -> str:
    """The frame as text for ``width`` x ``height``; ``mark`` styles a straggler's words."""
    lines = [_header(frame)]
    rows = frame.ranks
    per_node = len(rows) + 6 > height
    if per_node:
        rows = _worst_per_node(rows)
        lines.append(f"{len(frame.ranks)} ranks: one row per node, its worst rank")
    if width < NARROW:
        lines += [_rank_words(r, mark) for r in rows]
    else:
        table = [("RANK", "NODE", "HOST", "GPU", "STEP", "STEP/S", "SAMPLES/S", "LAST",
                  "OUTSIDE", "DATA", "UTIL", "MEM", "")]
        table += [(str(r.rank), _s(r.node_rank), r.host or "-", _gpu(r), _s(r.step),
                   _f(r.steps_per_s, 2), _f(r.samples_per_s, 1), _ago(r), _ms(_outside(r)),
                   _ms(r.data_s), "-" if r.gpu_util is None else f"{r.gpu_util}%",
                   "-" if r.gpu_mem_mib is None else f"{r.gpu_mem_mib / 1024:.1f}G",
                   mark("STRAGGLER") if r.straggler else ("silent" if r.silent else ""))
                  for r in rows]
        lines.append(format_table(table).rstrip("\n"))
    lines += _footer(frame, mark)
    return "\n".join(lines) + "\n"


def _header(frame: TopFrame) -> str:
    elapsed = "-" if frame.elapsed_s is None else _duration(frame.elapsed_s)
    world = "-" if frame.world_size is None else frame.world_size
    return (f"run {frame.run_id}  {frame.state}  owner {frame.owner}  attempt "
            f"{frame.attempt}  elapsed {elapsed}  world size {world}")


_OVER = {"mean": ", mean over the run", "result": ", mean over the run (rank 0's result)"}


def _footer(frame: TopFrame, mark) -> list[str]:
    speed = [f"{frame.samples_per_s:g} samples/s"] if frame.samples_per_s is not None else []
    speed += [f"{frame.steps_per_s:g} steps/s"] if frame.steps_per_s is not None else []
    none = "no rate yet" if frame.live else "no rate recorded"
    lines = [f"gang: {', '.join(speed) + _OVER.get(frame.rates, '') if speed else none}"]
    slow = frame.slowest
    if slow is not None:
        row = next((r for r in frame.ranks if r.rank == slow.rank), None)
        where = f" (node {row.node_rank}, {row.host}{_model(row)})" if row else ""
        lines.append(mark(f"slowest: rank {slow.rank}{where}: {slow.why}"))
    else:
        silent = sum(r.silent for r in frame.ranks)
        lines.append("slowest: none holds the gang back" + (
            f" ({silent} silent rank{'s' if silent != 1 else ''} not judged)" if silent else ""))
    if frame.ended:
        at = "" if frame.ended_at is None else \
            " " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(frame.ended_at))
        lines.append(f"ended{at}: {frame.ended}")
    return lines


def _worst_per_node(rows: Sequence[RankRow]) -> tuple[RankRow, ...]:
    """Each node's worst rank: a straggler, else the one with the oldest progress."""
    worst: dict[Any, RankRow] = {}
    for r in rows:
        best = worst.get(r.node_rank)
        if best is None or _badness(r) > _badness(best):
            worst[r.node_rank] = r
    return tuple(worst[k] for k in sorted(worst, key=lambda k: (k is None, k or 0)))


def _badness(r: RankRow) -> tuple:
    return (r.straggler is not None, -1 if r.last_progress_s_ago is None
            else r.last_progress_s_ago)


def _rank_words(r: RankRow, mark) -> str:
    words = [f"rank {r.rank} node {_s(r.node_rank)} {r.host or '-'} GPU {_gpu(r)}:",
             "silent" if r.silent else f"step {_s(r.step)}, {_f(r.steps_per_s, 2)} steps/s, "
                                       f"last {_ago(r)}, outside {_ms(_outside(r))}"]
    if r.gpu_util is not None:
        words.append(f", {r.gpu_util}% busy")
    line = " ".join(words[:2]) + "".join(words[2:])
    return line + (" " + mark(f"STRAGGLER: {r.straggler}") if r.straggler else "")


def _model(r: RankRow) -> str:
    return f", {r.gpu_model}" if r.gpu_model else ""


def _outside(r: RankRow) -> float | None:
    return None if r.compute_s is None or r.data_s is None else r.compute_s + r.data_s


def _gpu(r: RankRow) -> str:
    if r.gpu is None:
        return "-"
    return f"{r.gpu} {r.gpu_model}" if r.gpu_model else str(r.gpu)


def _s(value: object) -> str:
    return "-" if value is None else str(value)


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


def _ago(r: RankRow) -> str:
    return "-" if r.last_progress_s_ago is None else f"{r.last_progress_s_ago:.0f}s"


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}" if hours else f"{m}:{s:02d}"
