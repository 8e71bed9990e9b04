"""Every Python and shell block of README.md runs, in order, as a reader would run them.

The blocks share one scratch directory (the reader's project) and one CONVEYOR_HOME (the
embedded SQLite default), so a block that enqueues feeds the worker of the next one:

- a Python block whose first line is a comment naming a file (`# billing/tasks.py: ...`)
  is written to that file before any block runs, so later blocks can import it; it is
  checked by importing it as a module (`billing.tasks`);
- any other Python block runs as a script in the scratch directory;
- a shell block (sh, bash, shell) runs with `bash -eo pipefail`, the worktree's `conveyor`
  first on PATH; in a `console` block only the `$ ` lines run (the others are output);
- a TOML block is a `conveyor.toml`: `conveyor config show` must accept it (checked in a
  directory of its own, so its URLs never reach the other blocks).

A block that cannot run here (docker, kubectl, a daemon that never exits, a placeholder URL)
has `<!-- readme-test: skip (the reason) -->` on the line directly above its opening fence.
A marker without a reason, or one that is not directly above a fence, fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# The blocks run in order in one scratch project: one xdist worker takes them all.
pytestmark = pytest.mark.xdist_group("readme")

README = Path(__file__).parents[2] / "README.md"
BIN = Path(sys.executable).parent
LANGUAGES = {"python": "python", "py": "python", "python3": "python", "sh": "shell",
             "bash": "shell", "shell": "shell", "console": "console", "toml": "toml"}
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^<!--\s*readme-test:\s*skip\b(?P<rest>.*?)-->\s*$")
REASON = re.compile(r"^\s*\((?P<reason>.*\S.*)\)\s*$")
MODULE_FILE = re.compile(r"^#\s*(?P<path>[\w./-]+\.py)\b")
BLOCK_TIMEOUT = 60.0


@dataclass(frozen=True)
class Block:
    line: int           # of the opening fence, 1-based
    kind: str           # python, shell, console, toml
    code: str
    skip: str = ""      # the marker's reason; "" = run it

    @property
    def module_file(self) -> str:
        """The file a Python block defines (`# billing/tasks.py: ...`), or ""."""
        match = MODULE_FILE.match(self.code) if self.kind == "python" else None
        return match.group("path") if match else ""

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
    root = tmp_path_factory.mktemp("readme")
    for block in BLOCKS:
        if block.module_file and not block.skip:
            target = root / block.module_file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
    yield root


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


@pytest.mark.parametrize(("text", "problem"), [
    ("<!-- readme-test: skip -->\n```sh\nfalse\n```\n", "must give its reason"),
    ("<!-- readme-test: skip () -->\n```sh\nfalse\n```\n", "must give its reason"),
    ("<!-- readme-test: skip (daemon) -->\n\n```sh\nfalse\n```\n", "directly above"),
    ("<!-- readme-test: skip (daemon) -->\ntext\n", "directly above"),
])
def test_a_marker_without_reason_or_away_from_a_block_is_reported(text: str,
                                                                   problem: str) -> None:
    assert any(problem in p for p in parse(text)[1]), parse(text)


def test_parse_reads_kinds_reasons_and_defined_files() -> None:
    text = ("# Title\n<!-- readme-test: skip (needs docker) -->\n```sh\ndocker ps\n```\n"
            "```python\n# pkg/mod.py: a module\nX = 1\n```\n```\ndiagram\n```\n"
            "```toml\nconcurrency = 2\n```\n```console\n$ conveyor status\nqueues\n```\n")
    blocks, problems = parse(text)
    assert problems == []
    assert [(b.line, b.kind, b.skip, b.module_file) for b in blocks] == [
        (3, "shell", "needs docker", ""), (6, "python", "", "pkg/mod.py"),
        (13, "toml", "", ""), (16, "console", "", "")]
