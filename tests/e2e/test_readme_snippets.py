"""Every Python and shell block of README.md runs, in order, as a reader would run them.

The blocks share one scratch directory (the reader's project) and one CONVEYOR_HOME (the
embedded SQLite default), so a block that enqueues feeds the worker of the next one:

- a Python block whose first line is a comment naming a file (`# billing/tasks.py: ...`)
  is written to that file before any block runs, so later blocks can import it; it is
  checked by importing it as a module (`billing.tasks`);
- any other Python block runs as a script in the scratch directory;
- a shell block (sh, bash, shell) runs with `bash -eo pipefail`, the worktree's `conveyor`
  first on PATH; in a `console` block only the `$ ` lines run (the others are output);
- a comment `# … → TEXT` on a line of a shell or Python block says what the block prints:
  its output (stdout, or a daemon's log lines on stderr) must contain TEXT (the rest of the
  line);
- a TOML block is a `conveyor.toml`: `conveyor config show` must accept it (checked in a
  directory of its own, so its URLs never reach the other blocks).

A block that cannot run here (docker, kubectl, a daemon that never exits, a placeholder URL)
has `<!-- readme-test: skip (the reason) -->` on the line directly above its opening fence.
A marker without a reason, or one that is not directly above a fence, fails the test.

A block marked `<!-- readme-test: beside-up -->` is what the README tells a reader to type
"in another terminal" while `conveyor up` runs: it runs verbatim from the repository root in
a new shell (no venv on PATH, none of our variables), beside a real `conveyor up` that ran
the example DAG, and its output must say what the README says it shows.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import free_port

# The blocks run in order in one scratch project: one xdist worker takes them all.
pytestmark = pytest.mark.xdist_group("readme")

README = Path(__file__).parents[2] / "README.md"
BIN = Path(sys.executable).parent
LANGUAGES = {"python": "python", "py": "python", "python3": "python", "sh": "shell",
             "bash": "shell", "shell": "shell", "console": "console", "toml": "toml"}
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^<!--\s*readme-test:\s*(?P<mode>skip|beside-up)\b(?P<rest>.*?)-->\s*$")
BESIDE_UP = "beside-up"
REASON = re.compile(r"^\s*\((?P<reason>.*\S.*)\)\s*$")
PRINTS = re.compile(r"#.*?→ (?P<text>.+?)\s*$")
MODULE_FILE = re.compile(r"^#\s*(?P<path>[\w./-]+\.py)\b")
BLOCK_TIMEOUT = 60.0


@dataclass(frozen=True)
class Block:
    line: int           # of the opening fence, 1-based
    kind: str           # python, shell, console, toml
    code: str
    skip: str = ""      # the marker's reason; "" = run it; BESIDE_UP: beside `conveyor up`

    @property
    def module_file(self) -> str:
        """The file a Python block defines (`# billing/tasks.py: ...`), or ""."""
        match = MODULE_FILE.match(self.code) if self.kind == "python" else None
        return match.group("path") if match else ""

    @property
    def prints(self) -> list[str]:
        """What the block says it prints (`# … → TEXT` comments), in order."""
        if self.kind not in ("shell", "python"):
            return []
        return [m.group("text") for line in self.code.splitlines()
                if (m := PRINTS.search(line))]

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.kind})"


def parse(text: str) -> tuple[list[Block], list[str]]:
    """The runnable blocks of a Markdown text, and what is wrong with its skip markers."""
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            problems += _stray_marker(lines, index)
            index += 1
            continue
        end = _closing(lines, index, opening.group("fence"))
        kind = LANGUAGES.get(opening.group("lang").lower(), "")
        reason, problem = _marker_above(lines, index)
        problems += [problem] if problem else []
        if kind:
            blocks.append(Block(index + 1, kind, "\n".join(lines[index + 1:end]) + "\n",
                                reason))
        index = end + 1
    return blocks, problems


def _closing(lines: list[str], start: int, fence: str) -> int:
    for index in range(start + 1, len(lines)):
        if lines[index].strip() == fence:
            return index
    return len(lines)


def _marker_above(lines: list[str], fence: int) -> tuple[str, str]:
    """(reason, problem) of the skip marker directly above the fence at `fence`, if any."""
    if fence == 0 or (marker := MARKER.match(lines[fence - 1].strip())) is None:
        return "", ""
    if marker.group("mode") == BESIDE_UP:
        return BESIDE_UP, ""
    reason = REASON.match(marker.group("rest"))
    if reason is None:
        return "", (f"README.md:{fence}: a skip marker must give its reason: "
                    "<!-- readme-test: skip (why this block cannot run in a test) -->")
    return reason.group("reason").strip(), ""


def _stray_marker(lines: list[str], index: int) -> list[str]:
    """A marker that is not directly above a fence skips nothing: say so."""
    if not MARKER.match(lines[index].strip()):
        return []
    following = lines[index + 1] if index + 1 < len(lines) else ""
    if FENCE.match(following):
        return []
    return [f"README.md:{index + 1}: a skip marker must be the line directly above a "
            "block's opening fence"]


BLOCKS, PROBLEMS = parse(README.read_text())


def scratch_env(home: Path) -> dict[str, str]:
    """The reader's shell: no CONVEYOR_* of ours, a private data directory, our `conveyor`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.pop("PYTHONPATH", None)
    env.update(CONVEYOR_HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The reader's project directory, with every file the README's blocks define."""
    one_process(tmp_path_factory.getbasetemp())
    root = tmp_path_factory.mktemp("readme")
    for block in BLOCKS:
        if block.module_file and not block.skip:
            target = root / block.module_file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
    yield root


def one_process(basetemp: Path) -> None:
    """The blocks share one project, so they must run in one process, in order: say so if
    xdist handed them to two (its xdist_group is not honoured with pytest 9, for one)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker:
        return
    claim = basetemp.parent / "readme-blocks-worker"
    try:
        with claim.open("x") as mark:
            mark.write(worker)
    except FileExistsError:
        holder = claim.read_text()
        assert holder == worker, (
            f"README blocks run in two xdist workers ({holder} and {worker}): each gets its own "
            "project, so a block misses what an earlier one did; --dist loadgroup and a "
            "pytest that honours xdist_group (pytest<9 with pytest-xdist 3.8) keep them in one")


def command_for(block: Block, root: Path) -> list[str]:
    if block.kind == "shell":
        return ["bash", "-eo", "pipefail", "-c", block.code]
    if block.kind == "console":
        commands = [line[2:] for line in block.code.splitlines() if line.startswith("$ ")]
        return ["bash", "-eo", "pipefail", "-c", "\n".join(commands)]
    if block.kind == "toml":
        own = root / f"toml-{block.line}"
        own.mkdir(exist_ok=True)
        (own / "conveyor.toml").write_text(block.code)
        return ["bash", "-c", f"cd {own} && conveyor config show"]
    if block.module_file:
        module = block.module_file.removesuffix(".py").replace("/", ".")
        return [sys.executable, "-c", f"import {module}"]
    script = root / f"readme_block_{block.line}.py"
    script.write_text(block.code)
    return [sys.executable, script.name]


def test_every_skip_marker_gives_a_reason_and_sits_above_a_block() -> None:
    assert not PROBLEMS, "\n".join(PROBLEMS)


def test_the_readme_has_python_and_shell_blocks_to_run() -> None:
    kinds = {block.kind for block in BLOCKS if not block.skip}
    assert {"python", "shell"} <= kinds, f"runnable blocks found: {BLOCKS}"


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}-{b.kind}" for b in BLOCKS])
def test_readme_snippets(block: Block, project: Path) -> None:
    """Blocks run in README order (pytest keeps parametrize order), sharing one project."""
    if block.skip == BESIDE_UP:
        pytest.skip(f"{block}: runs beside `conveyor up` in test_another_terminal_beside_up")
    if block.skip:
        pytest.skip(f"{block}: {block.skip}")
    try:
        done = subprocess.run(command_for(block, project), cwd=project,
                              env=scratch_env(project / "home"), capture_output=True,
                              text=True, timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block} still ran after {BLOCK_TIMEOUT:.0f} s: if it is a daemon, mark "
                    "it <!-- readme-test: skip (the reason) -->")
    assert done.returncode == 0, (
        f"{block} failed with exit code {done.returncode}; fix the block (or the code), or "
        f"mark it <!-- readme-test: skip (the reason) --> if it cannot run in a test.\n"
        f"--- block ---\n{block.code}--- stdout ---\n{done.stdout[-3000:]}"
        f"--- stderr ---\n{done.stderr[-3000:]}")
    assert "Traceback" not in done.stdout + done.stderr, (
        f"{block} printed a traceback: errors are one line for people\n{done.stderr[-3000:]}")
    missing = [text for text in block.prints if text not in done.stdout + done.stderr]
    assert not missing, (f"{block} says it prints {missing}, and did not:\n"
                         f"--- stdout ---\n{done.stdout[-3000:]}"
                         f"--- stderr ---\n{done.stderr[-3000:]}")


UI_BLOCK = next(b for b in BLOCKS if "conveyor ui --port 8700" in b.code)
CURL_BLOCK = next(b for b in BLOCKS if b.line > UI_BLOCK.line and "curl " in b.code)


@contextmanager
def serving(code: str, env: dict[str, str], cwd: Path) -> Iterator[list[str]]:
    """Run a block that serves until Ctrl-C; yield its output up to `serving`; then Ctrl-C
    it (SIGINT to its process group, as a terminal does) and wait for it to stop."""
    from tests.e2e.test_up import close, read_until
    shell = subprocess.Popen(["bash", "-eo", "pipefail", "-c", code], cwd=cwd, env=env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield read_until(shell, "conveyor ui: serving", timeout=BLOCK_TIMEOUT)
    finally:
        os.killpg(shell.pid, signal.SIGINT)
        try:
            shell.wait(30)
        finally:
            if shell.poll() is None:
                os.killpg(shell.pid, signal.SIGKILL)
                shell.wait(30)
            close(shell)


def curl(port: int, env: dict[str, str], cwd: Path) -> str:
    """The README's curl block, on the port the test's `conveyor ui` took; its stdout."""
    done = subprocess.run(["bash", "-eo", "pipefail", "-c",
                           CURL_BLOCK.code.replace(":8700", f":{port}")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{CURL_BLOCK} failed: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_the_dashboard_blocks(project: Path) -> None:
    """The Dashboard's two blocks as a reader runs them, after the blocks above (same project
    and data directory): `conveyor ui` serves read-only and refuses curl's requeue; then the
    block's token, exported and echoed, is what another terminal exports for curl, whose
    requeue is done, and curl prints what the block says. Only the port differs: 8700 may be
    taken here (CONVEYOR_UI_PORT for the bare `conveyor ui`, the flag's value replaced)."""
    port = free_port()
    env = scratch_env(project / "home") | {"CONVEYOR_UI_PORT": str(port)}
    lines = UI_BLOCK.code.splitlines()
    token_from = next(i for i, line in enumerate(lines) if line.startswith("export "))
    read_only = "\n".join(lines[:token_from])
    with_token = "\n".join(lines[token_from:]).replace("--port 8700", f"--port {port}")
    with serving(read_only, env, project) as said:
        assert "read-only" in said[-1], said
        out = curl(port, env, project)
    assert '{"runs": [' in out and "read-only" in out, out     # the POST is refused: 403
    with serving(with_token, env, project) as said:
        token = said[0].strip()
        assert re.fullmatch(r"[0-9a-f]{32}", token), said        # what `echo` printed
        out = curl(port, env | {"CONVEYOR_UI_TOKEN": token}, project)
        refused = curl(port, env, project)                       # not exported: 401
    missing = [text for text in CURL_BLOCK.prints if text not in out]
    assert not missing, f"{CURL_BLOCK} says it prints {missing}, and did not:\n{out}"
    assert '"error"' not in out and '"error"' in refused, (out, refused)


@pytest.mark.parametrize(("text", "problem"), [
    ("<!-- readme-test: skip -->\n```sh\nfalse\n```\n", "must give its reason"),
    ("<!-- readme-test: skip () -->\n```sh\nfalse\n```\n", "must give its reason"),
    ("<!-- readme-test: skip (daemon) -->\n\n```sh\nfalse\n```\n", "directly above"),
    ("<!-- readme-test: skip (daemon) -->\ntext\n", "directly above"),
])
def test_a_marker_without_reason_or_away_from_a_block_is_reported(text: str,
                                                                   problem: str) -> None:
    assert any(problem in p for p in parse(text)[1]), parse(text)


def test_what_a_block_says_it_prints_is_read_from_its_comments() -> None:
    block = Block(1, "shell", "a  # → 7 run(s) created\nb   # no arrow\nc  # why → 200.25\n")
    assert block.prints == ["7 run(s) created", "200.25"]
    assert Block(1, "toml", "x = 1  # → no\n").prints == []


def test_the_readme_says_what_its_examples_print() -> None:
    """The backfill's count and the TaskFlow run are checked by what they print."""
    said = [text for block in BLOCKS if not block.skip for text in block.prints]
    assert "7 run(s) of revenue created, 0 already there" in said
    assert any("3 orders (run" in text for text in said), said


def test_parse_reads_kinds_reasons_and_defined_files() -> None:
    text = ("# Title\n<!-- readme-test: skip (needs docker) -->\n```sh\ndocker ps\n```\n"
            "```python\n# pkg/mod.py: a module\nX = 1\n```\n```\ndiagram\n```\n"
            "```toml\nconcurrency = 2\n```\n```console\n$ conveyor status\nqueues\n```\n")
    blocks, problems = parse(text)
    assert problems == []
    assert [(b.line, b.kind, b.skip, b.module_file) for b in blocks] == [
        (3, "shell", "needs docker", ""), (6, "python", "", "pkg/mod.py"),
        (13, "toml", "", ""), (16, "console", "", "")]


REPO = README.parent
BESIDE = [block for block in BLOCKS if block.skip == BESIDE_UP]


def new_shell(home: Path) -> dict[str, str]:
    """A terminal opened beside `conveyor up`: the system PATH (no venv active), none of our
    variables but the data directory `up` uses (in a test, never the real one)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONVEYOR_", "VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if Path(p).resolve() != BIN.resolve())
    env["CONVEYOR_HOME"] = str(home)
    return env


def test_the_readme_has_a_block_for_another_terminal() -> None:
    assert len(BESIDE) == 1, "README.md's 'In another terminal' block lost its marker"


@pytest.mark.slow
@pytest.mark.parametrize("block", BESIDE, ids=[f"line{b.line}" for b in BESIDE])
def test_another_terminal_beside_up(block: Block, tmp_path: Path) -> None:
    """`conveyor up` (as run.sh starts it) runs the example DAG; the block, typed verbatim in
    a new shell in the repository root, shows that run, the DAGs and the dead letters."""
    from tests.e2e.test_up import close, interrupt, read_until
    if not (REPO / ".venv" / "bin" / "activate").exists() or \
            Path(sys.executable).parent.resolve() != (REPO / ".venv" / "bin").resolve():
        pytest.skip(f"{block} activates {REPO}/.venv, and this test runs in another venv")
    home = tmp_path / "home"
    up = subprocess.Popen([sys.executable, "-m", "conveyor.cli", "up", "--metrics-port=0",
                           "--ui-port=0", "--drain-timeout=5"], cwd=REPO, text=True,
                          env=new_shell(home), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        banner = read_until(up, "of revenue: success", timeout=120)
        run_id = banner[-1].split()[1]
        activate = f"(another terminal: . {Path(sys.executable).parent / 'activate'})"
        assert any(activate in line for line in banner), banner   # up says it too
        done = subprocess.run(["bash", "-eo", "pipefail", "-c", block.code], cwd=REPO,
                              env=new_shell(home), capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL)
        assert interrupt(up) == []
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(30)
        close(up)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    out = done.stdout
    assert re.search(rf"^{run_id}\s+revenue\s+success\s", out, re.M), out   # status, runs list
    assert re.search(r"^revenue\s+", out, re.M), out                           # dags list
    assert "ID  QUEUE  TASK  DELIVERIES  DEAD_AT  REASON" in out                 # dead letters


def test_the_quoted_config_error_is_what_conveyor_prints(tmp_path: Path) -> None:
    """The Configuration section quotes the line a wrong `conveyor.toml` value stops with."""
    prose = " ".join(README.read_text().split())     # the quote may wrap across lines
    quoted = re.search(r"`(conveyor: conveyor\.toml: concurrency='0' [^`]+)`", prose)
    assert quoted, "README.md no longer quotes the concurrency = 0 error"
    (tmp_path / "conveyor.toml").write_text("concurrency = 0\n")
    done = subprocess.run([str(BIN / "conveyor"), "worker"], cwd=tmp_path, text=True,
                          env=scratch_env(tmp_path / "home"), capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stderr.strip()) == (2, quoted.group(1))


def test_the_project_examples_say_to_stop_up_or_use_a_data_directory_of_their_own() -> None:
    """`conveyor up` left running takes a project's `default` messages on the same data
    directory, and dead-letters what it cannot import: the README says so before the
    project's first file."""
    text = README.read_text()
    intro = text[text.index("## Tasks and DAGs"):text.index("# billing/tasks.py")]
    assert "Stop `conveyor up` first" in intro and "unknown task" in intro
    assert "export CONVEYOR_HOME=$PWD/.conveyor" in intro


def test_the_dashboard_token_is_one_the_reader_can_type_and_curl_can_send() -> None:
    """The token is exported and shown before `conveyor ui` starts with it: set only for
    that command, it was in no shell for the curl example below, nor known to type in."""
    ui_block = next(b for b in BLOCKS if "conveyor ui --port 8700" in b.code)
    lines = ui_block.code.splitlines()
    serving = next(i for i, line in enumerate(lines) if "conveyor ui --port 8700" in line)
    assert any(line.startswith("export CONVEYOR_UI_TOKEN=") for line in lines[:serving])
    assert any('echo "$CONVEYOR_UI_TOKEN"' in line for line in lines[:serving])
    assert any("$CONVEYOR_UI_TOKEN" in b.code and "curl" in b.code for b in BLOCKS
               if b.line > ui_block.line)
