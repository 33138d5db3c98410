"""The user docs' promises: the README's two commands, CI running the test
one, and examples that stay true to the code (commands, flags, links, the
outline). The user docs are README.md and the guide in docs/, one page a
topic; a number or a table is checked in the one page that holds it.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shlex
import sys

import click

from conftest import ROOT
from sshlab import lacking
from orchestrator.cli.main import main as cli
from orchestrator.backends import backend_class
from orchestrator.config.spec import BACKENDS
from orchestrator.engine.options import LaunchOptions
from workloads.catalog import CATALOG

# The README is for a newcomer; the rest is reference, a page a topic.
README_MAX_LINES = 400
DOCS = ("README.md", *sorted(os.path.relpath(path, ROOT)
                             for path in glob.glob(os.path.join(ROOT, "docs", "*.md"))))
# Rendered by scripts/reliability-table, not written by hand.
GENERATED = ("docs/reliability.md",)

# The order a newcomer needs: first run, the file, here, a cluster, Slurm,
# the runs it leaves and the commands, failures, then where the rest is.
OUTLINE = (
    "Quick start",
    "The cluster file",
    "Running on this machine",
    "Running on a cluster",
    "Running on Slurm",
    "Runs and managing them",
    "When things go wrong",
    "The user guide",
    "Tests",
    "Benchmarks",
)

# Flags of other programs the README shows; each with whose it is. The
# torchrun and sbatch/srun flags of the dry-run are taken from the goldens.
FOREIGN_FLAGS = {
    "--overlap": "srun (the stack-dump step in a Slurm job)",
    "--name": "a placeholder in the slurm.extra comment",
    "--no-index": "pip, in the tests' setup example",
    "--target": "pip, in the tests' setup example",
    "--config": "the example project's train.py",
    "--cache": "the example project's mypkg.prepare",
    "--test": "scripts/bootstrap",
    # accelerate launch's, in the Accelerate example's by-hand lines; the
    # lines themselves are parsed with accelerate's own parser below.
    "--multi_gpu": "accelerate launch", "--num_machines": "accelerate launch",
    "--num_processes": "accelerate launch", "--machine_rank": "accelerate launch",
    "--main_process_ip": "accelerate launch", "--main_process_port": "accelerate launch",
    "--gpu_ids": "accelerate launch", "--cpu": "accelerate launch",
    "--mpirun_hostfile": "accelerate launch",
    "--query-remapped-rows": "nvidia-smi (GPU health: row remapping)",
    "--shm-size": "docker run (a small /dev/shm)", "--ipc": "docker run (a small /dev/shm)",
    "--requeue": "sbatch (docs/reliability.md: Slurm's own restart)",
    "--write": "scripts/reliability-table (it renders docs/reliability.md)",
}
# `ddp-orch` followed by a word in a message, not a command.
NOT_COMMANDS = {"agent", "at"}  # "the ddp-orch agent did not answer", "runs/ of ddp-orch at"
REPO_DIRS = ("orchestrator", "workloads", "tests", "bench", "schema", "scripts", "docs",
             "examples")


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return fh.read()


def user_docs() -> str:
    """README.md and every page of docs/, one text: where a promise is
    looked for when it may live in any of them."""
    return "\n\n".join(read(doc) for doc in DOCS)


def readme_commands() -> list[str]:
    section = read("README.md").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, re.S)


def fences(text: str) -> list[str]:
    return re.findall(r"^ *```[^\n]*\n(.*?)^ *```", text, re.S | re.M)


def without_fences(text: str) -> str:
    return re.sub(r"^ *```[^\n]*\n.*?^ *```", "", text, flags=re.S | re.M)


def code_spans(text: str) -> list[str]:
    """Inline code outside fenced blocks (a span may wrap a line), one space
    for each run of white space."""
    spans = re.findall(r"``(.+?)``|`([^`]+)`", without_fences(text), re.S)
    return [re.sub(r"\s+", " ", a or b).strip() for a, b in spans]


def code_lines(text: str) -> list[str]:
    """Every fenced line and every inline code span: where commands are shown."""
    return [line for block in fences(text) for line in block.splitlines()] + code_spans(text)


def prose(text: str) -> str:
    return re.sub(r"\s+", " ", without_fences(text))


def h2_titles(text: str) -> list[str]:
    return re.findall(r"^## (.+?)\s*$", without_fences(text), re.M)


def section(text: str, title: str) -> str:
    return without_fences(text).split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def cli_options() -> dict[str, set[str]]:
    """Each `ddp-orch` subcommand and its long options, as `--help` lists them."""
    ctx = click.Context(cli)
    commands = {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
    return {name: {opt for param in cmd.params
                   for opt in (*param.opts, *param.secondary_opts) if opt.startswith("--")}
            | {"--help"}
            for name, cmd in commands.items()}


def flags_in(text: str) -> set[str]:
    """Every long flag, whole: other programs' flags may hold underscores
    (`--num_processes`)."""
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]*)", text))


def command_uses(text: str, commands: set[str]) -> list[tuple[str, str]]:
    """(subcommand, the rest of its command line) for every `ddp-orch CMD ...`
    shown, and every code span that starts with a subcommand and a flag
    (`up --detach`). The rest stops at `--` (the program's own arguments),
    a `#` comment or a `|`."""
    uses = []
    for line in code_lines(text):
        for match in re.finditer(r"(?<![\w.'-])ddp-orch ([a-z][a-z-]*)(?=(.*))", line):
            uses.append((match.group(1), match.group(2)))
        first = re.match(r"([a-z]+) (.*--.*)", line)
        if first and first.group(1) in commands:
            uses.append((first.group(1), first.group(2)))
    return [(cmd, re.split(r" -- | --$|#|\|| ddp-orch ", rest + " ")[0]) for cmd, rest in uses]


def github_anchor(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    titles = re.findall(r"^#{1,6} (.+)$", without_fences(text), re.M)
    return {github_anchor(t) for t in titles} | set(re.findall(r'<a id="([^"]+)"', text))


# the two commands ------------------------------------------------------------


def test_readme_gives_exactly_two_setup_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "ddp-orch up --local" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_lines = [line.strip() for line in read(".ci/run").splitlines()]
    assert readme_commands()[1] in ci_lines


def test_the_dry_run_page_shows_the_golden_dry_run():
    golden = read("tests/golden/example.text.txt")
    first_node = golden.split("\nnode 1 ")[0]
    assert first_node in read("docs/dry-run.md")


# the README and its guide ------------------------------------------------------


def test_the_readme_is_short_enough_for_a_newcomer():
    lines = read("README.md").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, over {README_MAX_LINES}: move reference to docs/")


def test_every_guide_page_links_back_and_the_readme_links_every_page():
    """Each page of docs/ says what it is and links back to the README in its
    first paragraph; the README links every page, so none is an orphan."""
    readme_links = set(re.findall(r"\]\((docs/[^)#\s]+)", read("README.md")))
    for doc in DOCS[1:]:
        assert doc in readme_links, f"the README does not link {doc}"
        if doc in GENERATED:
            continue
        title, summary = read(doc).split("\n\n", 2)[:2]
        assert title.startswith("# "), f"{doc} starts with no title"
        assert "](../README.md" in summary, f"{doc}: no link back to the README under its title"


# the outline and its terms -----------------------------------------------------


def test_readme_sections_come_in_the_order_a_user_needs_them():
    assert tuple(h2_titles(read("README.md"))) == OUTLINE


def test_kept_run_is_defined_once_before_any_use():
    assert prose(user_docs()).count("**kept run**") == 1, "define the term once, in bold"
    text = prose(read("README.md"))
    assert text.count("**kept run**") == 1, "define the term in the README"
    definition = text.index("**kept run**")
    first_use = re.search(r"kept runs?\b", text, re.I).start()
    assert first_use == definition + 2, (
        f"'kept run' used before its definition: ...{text[first_use - 60:first_use + 40]}...")
    sentence = text[definition:text.index(". ", definition)]
    assert "`--detach`" in sentence and "`--max-restarts`" in sentence


def test_the_owner_rules_are_one_table_that_quotes_the_dry_run():
    """Every owner a backend decides, for every way of launching it
    (``--detach``, ``--max-restarts``), has its row quoting the dry-run's
    owner line word for word, once in the user docs."""
    text = user_docs()
    table = section(read("docs/long-runs.md"), "Who keeps a run alive")
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    lines = set()
    for name in BACKENDS:
        cls = backend_class(name)
        for detach in (False, True):
            for restarts in ((0, 1) if cls.can.restarts else (0,)):
                owner, words = cls(LaunchOptions(detach=detach, max_restarts=restarts)).owner()
                lines.add(f'"{owner}: {words}"')
    assert len(lines) == 5  # controller, keepers (attached, detached), scheduler (both)
    for quoted in lines:
        assert text.count(quoted) == 1, f"the owner line {quoted} is not explained once"
        assert sum(quoted in row for row in rows) == 1, f"no row of the table quotes {quoted}"


# the examples are true ---------------------------------------------------------


def test_every_ddp_orch_subcommand_shown_exists():
    options = cli_options()
    assert command_uses(read("README.md"), set(options))
    for doc in DOCS:
        shown = {cmd for cmd, _ in command_uses(read(doc), set(options))}
        unknown = shown - set(options) - NOT_COMMANDS
        assert not unknown, f"{doc} shows ddp-orch subcommands that do not exist: {unknown}"


def test_every_flag_shown_on_a_command_line_is_that_commands_option():
    options = cli_options()
    wrong = {(doc, cmd, flag)
             for doc in DOCS
             for cmd, rest in command_uses(read(doc), set(options)) if cmd in options
             for flag in flags_in(rest) - options[cmd]}
    assert not wrong, f"flags a subcommand does not take (doc, command, flag): {sorted(wrong)}"


def test_every_flag_mentioned_exists_somewhere():
    known = set().union(*cli_options().values())
    known |= {arg.flag for info in CATALOG.values() for arg in info.args}
    for golden in glob.glob(os.path.join(ROOT, "tests", "golden", "*.txt")):
        with open(golden, encoding="utf-8") as fh:
            known |= flags_in(fh.read())  # torchrun's, sbatch's and srun's, as the dry-run prints them
    known |= set(FOREIGN_FLAGS)
    for doc in DOCS:
        unknown = flags_in(read(doc)) - known
        assert not unknown, f"{doc} mentions flags nothing takes: {sorted(unknown)}"


def test_every_relative_link_resolves():
    """Every relative link in the README and docs/ names a file that exists,
    and a heading of it where the link has a fragment."""
    for doc in DOCS:
        text = read(doc)
        base = os.path.dirname(os.path.join(ROOT, doc))
        links = re.findall(r"\]\(([^)\s]+)\)", without_fences(text))
        assert links or doc in GENERATED, doc
        for link in links:
            if re.match(r"[a-z]+:", link):
                continue
            path, _, fragment = link.partition("#")
            target = os.path.normpath(os.path.join(base, path)) if path else os.path.join(ROOT, doc)
            assert os.path.exists(target), f"{doc}: link to a missing file: {link}"
            if fragment and target.endswith(".md"):
                with open(target, encoding="utf-8") as fh:
                    assert fragment in anchors(fh.read()), f"{doc}: no heading for {link}"


def test_every_repository_path_shown_exists():
    shown = 0
    for doc in DOCS:
        paths = [span for span in code_spans(read(doc))
                 if re.fullmatch(rf"(?:{'|'.join(REPO_DIRS)})/[\w./-]*", span)]
        shown += len(paths)
        missing = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
        assert not missing, f"{doc} names paths that do not exist: {missing}"
    assert shown


def test_every_cluster_file_key_is_in_the_readme_table():
    from orchestrator.config.loader import TOP_KEYS
    table = section(read("README.md"), "The cluster file")
    keys = set(re.findall(r"^\| `([a-z_]+)[`.\[]", table, re.M))
    keys |= set(re.findall(r"/ `([a-z_]+)`", table))
    assert set(TOP_KEYS) <= keys, f"keys the table leaves out: {set(TOP_KEYS) - keys}"


def accelerate_launch_lines(text: str) -> list[list[str]]:
    """The words after `accelerate launch` on each fenced line that runs it,
    a line continued with `\\` read whole."""
    lines = [line for block in fences(text) for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line.split("accelerate launch ", 1)[1])
            for line in lines if "accelerate launch " in line and not line.startswith("#")]


def test_the_accelerate_launch_lines_are_accelerates_own_and_run_the_example(monkeypatch):
    """The by-hand lines that the Accelerate example is compared with parse
    with accelerate's own parser, as the text reads them: 8 processes in all
    on 2 machines, this one rank 0, and the example's script with its own
    arguments."""
    if importlib.util.find_spec("accelerate") is None:
        lacking(f"accelerate is not installed in {sys.prefix}: scripts/bootstrap --test "
                "installs it")
    from accelerate.commands.launch import launch_command_parser

    section_text = read("docs/own-project.md").split("## Hugging Face Accelerate\n", 1)[1]
    words = accelerate_launch_lines(section_text.split("\n## ", 1)[0])
    assert len(words) == 1, words
    args = launch_command_parser().parse_args(words[0])
    assert (args.multi_gpu, args.num_machines, args.num_processes, args.machine_rank) \
        == (True, 2, 8, 0)
    assert (args.main_process_ip, args.main_process_port) == ("gpu-a", 29500)
    example = os.path.join(ROOT, "examples", "accelerate", args.training_script)
    spec = importlib.util.spec_from_file_location("accelerate_example", example)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines; trains only as __main__
    monkeypatch.setattr(sys, "argv", [example, *args.training_script_args])
    assert module.parse_args().epochs == 5


# the numbers it promises --------------------------------------------------------

UNITS = {"": 1, "s": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def amount(text: str) -> float | None:
    """A number in the docs as the code keeps it: ``64 MiB`` in bytes, ``30 s``
    and ``30s`` in seconds, ``off``/``none`` as None, ``a second`` as 1."""
    if text in ("off", "none"):
        return None
    if text == "second":
        return 1
    number, unit = re.fullmatch(r"(\d+) ?(KiB|MiB|GiB|s)?", text).groups()
    return int(number) * UNITS[unit or ""]


def option(command: str, flag: str) -> click.Parameter:
    """``ddp-orch COMMAND``'s option ``flag``, as click parses it."""
    cmd = cli.get_command(click.Context(cli), command)
    return next(param for param in cmd.params if flag in param.opts)


def _numbers() -> list[tuple[str, object]]:
    """(the docs' words, each number a group; where the code keeps those
    numbers): every number with a unit the user docs promise of ddp-orch's own
    behaviour, not its example output or the benchmarks' measurements. A
    CLI default is read through click; a constant is imported."""
    from orchestrator.agent.kept import head, keeper, peers
    from orchestrator.agent.node import outputs
    from orchestrator.agent.wire import protocol
    from orchestrator.agent.worker import progress
    from orchestrator.config import spec
    from orchestrator.config.loader import MIN_HANG_TIMEOUT
    from orchestrator.engine import bundle, checknet, gang, gpuplan, results
    from orchestrator.plan import secrets
    from workloads import contract

    grace = option("up", "--grace").default
    return [
        # uploads and what comes home
        (r"over the (\d+ MiB) upload cap", bundle.MAX_SCRIPT_DIR_BYTES),
        (r"its secrets masked; (\d+ MiB) at most", bundle.MAX_SCRIPT_DIR_BYTES),
        (r"rank 0's `result\.json` \((\d+ MiB) at most\)", results.MAX_RESULT_BYTES),
        (r"Each file may have (\d+ MiB), all of them", results.MAX_OUTPUT_FILE_BYTES),
        (r"all of them (\d+ GiB) and \d+ files", results.MAX_OUTPUTS_BYTES),
        (r"all of them \d+ GiB and (\d+) files", results.MAX_OUTPUT_FILES),
        (r"all of them \d+ GiB and (\d+) files", outputs.MAX_FILES),  # node 0's own count
        # secrets
        (r"could be a credential: at least (\d+) characters", secrets.MIN_SECRET_CHARS),
        # the controller and its nodes
        (r"exchange a heartbeat every (\d+ s)", protocol.HEARTBEAT_S),
        (r"a silent partition is noticed on both sides within (\d+ s)", protocol.PEER_TIMEOUT_S),
        (r"`node 1 \(host\) silent for (\d+s); stopping every node`", protocol.PEER_TIMEOUT_S),
        (r"`lost: nothing from the node for (\d+s)`", protocol.PEER_TIMEOUT_S),
        (r"(\d+ s) of silence, then the teardown", protocol.PEER_TIMEOUT_S),
        (r"`--start-timeout` \(default (\d+ s)\)", option("up", "--start-timeout").default),
        (r"`--start-timeout` \(default (\d+ s)\)", option("compare", "--start-timeout").default),
        (r"`attempt 1 did not start within (\d+s) on node 0",
         option("up", "--start-timeout").default),
        (r"SIGTERM, `--grace` seconds, default (\d+), SIGKILL", option("down", "--grace").default),
        (r"SIGTERM, `up --grace` seconds, default (\d+), SIGKILL", grace),
        (r"`up --grace` seconds, default (\d+)", option("compare", "--grace").default),
        (r"one progress line per node every (\d+ s)", gang.QUIET_PROGRESS_S),
        # kept runs: the keepers' gang
        (r"within (\d+ s) with the default grace", peers.GANG_TIMEOUT_S + grace),
        (r"then the grace period: (\d+ s) at most with the default grace",
         peers.GANG_TIMEOUT_S + grace),
        (r"every node starts its teardown within (\d+ s)", peers.GANG_TIMEOUT_S),
        (r"when it is silent, (\d+ s) after the last heartbeat it sent \(so (\d+)-(\d+ s) after "
         r"it froze; heartbeats every (\d+ s)\)",
         (peers.GANG_TIMEOUT_S, peers.GANG_TIMEOUT_S - peers.GANG_HEARTBEAT_S,
          peers.GANG_TIMEOUT_S, peers.GANG_HEARTBEAT_S)),
        (r"notices its follower gone within (\d+ s)", keeper.FOLLOWER_POLL_S),
        (r"with at most (\d+) connections waiting for their hello", peers.MAX_PENDING),
        # restarts
        (r"waits up to (\d+ s) for any process of the attempt that would not die",
         keeper.SURVIVOR_WAIT_S),
        (r"would not die; waiting up to (\d+s)`", keeper.SURVIVOR_WAIT_S),
        (r"the restart waits until they are gone, (\d+ s) at most", keeper.SURVIVOR_WAIT_S),
        (r"still there (\d+ s) after the teardown", keeper.SURVIVOR_WAIT_S),
        (r"a backoff \((\d+ s) before the first restart, (\d+ s) before the second, doubling, "
         r"(\d+ s) at most\)",
         (head.restart_backoff(1), head.restart_backoff(2), head.MAX_BACKOFF_S)),
        (r"a backoff \((\d+ s) before the first restart, doubling, (\d+ s) at most\)",
         (head.restart_backoff(1), head.MAX_BACKOFF_S)),
        (r"`max_restarts: N` in the file; default (\d+)\)", spec.ClusterSpec.max_restarts),
        # hangs and progress
        (r"`hang_timeout:` in the file; at least (\d+ s), default (off)\)",
         (option("up", "--hang-timeout").type.min, option("up", "--hang-timeout").default)),
        (r"at least (\d+ s), default off", MIN_HANG_TIMEOUT),  # the cluster file's key too
        (r"at most one small file write a (second)", contract.HEARTBEAT_EVERY_S),
        (r"node's run directory, at most once a (second)\)", progress.EVERY_S),
        # check
        (r"each step with a timeout \(`--timeout`, (\d+ s)\)",
         option("check", "--timeout").default),
        (r"all at once, (\d+ s) each", checknet.CONNECT_TIMEOUT_S),
        (r"\*\*clock\*\* \(a warning beyond (\d+ s)\)", checknet.CLOCK_SKEW_S),
        (r"clocks within (\d+s) of each other", checknet.CLOCK_SKEW_S),
        # the cluster file's defaults
        (r"\| `setup` / `setup_timeout` \| none / (\d+) \|", spec.DEFAULT_SETUP_TIMEOUT),
        (r"setup_timeout: (\d+) +# seconds for a node's whole setup \(the default\)",
         spec.ClusterSpec.setup_timeout),
        (r"\| `gpu_policy\.busy_memory_mib` / `gpu_policy\.wait` \| (\d+) / (\d+) \|",
         (spec.ClusterSpec.gpu_busy_mib, spec.ClusterSpec.wait_gpus)),
        (r"`gpu_policy\.busy_memory_mib` \(default (\d+) MiB", spec.DEFAULT_GPU_BUSY_MIB),
        (r"GPUs are free, saying every (\d+ s), in one short line per waiting node",
         gpuplan.WAIT_SAY_S),
        (r"`--queue-timeout SECONDS` \(default: (none)\)", option("up", "--queue-timeout").default),
        (r'An `auto` master port is `"\$\{MASTER_PORT:-(\d+)\}"`', spec.DEFAULT_PORT),
    ]


def test_every_number_the_readme_promises_is_the_codes():
    """Each number the user docs promise (the README and docs/), read in their
    words, equals the code's constant or CLI default: changing either alone
    fails."""
    text = re.sub(r"\s+", " ", user_docs())
    wrong = []
    for phrase, code in _numbers():
        found = re.findall(phrase, text)
        if not found:
            wrong.append(f"the user docs no longer say /{phrase}/")
            continue
        want = code if isinstance(code, tuple) else (code,)
        for groups in found:
            said = tuple(amount(g) for g in ((groups,) if isinstance(groups, str) else groups))
            if said != want:
                wrong.append(f"/{phrase}/: the docs say {said}, the code {want}")
    assert not wrong, "\n".join(wrong)
