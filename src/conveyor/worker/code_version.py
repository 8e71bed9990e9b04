"""What code a worker runs, as one short name: `conveyor worker --code-version`, or derived.

Every worker announces one (registry, `started` events) and serves `<queue>@<version>`
beside each of its queues, unless given `--code-version none` (`OFF`): then it announces
none and runs pinned to it are not pinned.

A run pinned to its code (`DAG(pin_code=True)`, README "Runs pinned to their code") sends
its later tasks only to workers announcing the version its first task ran on, so the name
must change when the tasks' code does and stay equal across workers of one deploy. Derived
without running anything (a worker starts in milliseconds, `git` may be absent):

* the git revision of the checkout the first `--app` module (or DAG file) lives in, read
  from `.git/HEAD` and the ref it names (loose or packed; a worktree's `.git` file too);
* else a hash of the app modules' source files (a package: every `.py` file under it), so
  two hosts with the same installed code agree;
* none ('') for a worker with no app at all (it runs commands only: no code of its own).

An uncommitted edit in a checkout does not change its revision: give `--code-version`
where that matters.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

#: `--code-version none`: announce no version, serve no `<queue>@<version>`.
OFF = "none"


def announced(given: str, apps: Sequence[str]) -> str:
    """The version a worker announces: `given` (`--code-version`), none for `OFF`, else the
    one derived from `apps`."""
    if given == OFF:
        return ""
    return given or derive(apps)


def derive(apps: Sequence[str]) -> str:
    """The version of the code `apps` (module names or DAG file paths) load; see above
    ('': no app with a source file)."""
    files = [f for f in (_source_of(app) for app in apps) if f is not None]
    for file in files:
        revision = git_revision(file.parent)
        if revision:
            return revision
    return source_hash(files) if files else ""


def git_revision(start: Path) -> str:
    """The first 12 hex digits of the commit checked out in the repository holding `start`
    ('': not in a checkout, or its HEAD cannot be read)."""
    for folder in (start, *start.parents):
        dot_git = folder / ".git"
        if dot_git.exists():
            return _head(_git_dir(dot_git))[:12]
    return ""


def source_hash(files: Iterable[Path]) -> str:
    """A short hash of the source files, each a package's `.py` files when it is one."""
    digest = hashlib.sha256()
    for file in sorted({p for f in files for p in _package_files(f)}):
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return "src-" + digest.hexdigest()[:12]


def _source_of(app: str) -> Path | None:
    """The file an app entry is (a DAG file) or loads from (a module; its __init__ for a
    package), None when it has none (a namespace or built-in module)."""
    if app.endswith(".py"):
        return Path(app).resolve()
    module = sys.modules.get(app)
    origin = getattr(module, "__file__", None)
    if origin is None:
        try:
            spec = importlib.util.find_spec(app)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None else None
    return Path(origin).resolve() if origin and origin.endswith(".py") else None


def _package_files(file: Path) -> list[Path]:
    if file.name == "__init__.py":
        return sorted(p for p in file.parent.rglob("*.py") if "__pycache__" not in p.parts)
    return [file]


def _git_dir(dot_git: Path) -> Path:
    """The repository directory: `.git` itself, or where a worktree's `.git` file points."""
    if dot_git.is_dir():
        return dot_git
    text = dot_git.read_text(errors="replace").strip()
    pointed = text.removeprefix("gitdir:").strip()
    return (dot_git.parent / pointed).resolve()


def _head(git_dir: Path) -> str:
    """The commit HEAD names: detached (a hash) or through a ref, loose or packed."""
    try:
        head = (git_dir / "HEAD").read_text().strip()
    except OSError:
        return ""
    if not head.startswith("ref:"):
        return head if re.fullmatch(r"[0-9a-f]{40,64}", head) else ""
    ref = head.removeprefix("ref:").strip()
    common = _common_dir(git_dir)
    for where in (git_dir, common):
        loose = where / ref
        if loose.is_file():
            return loose.read_text().strip()
    return _packed(common / "packed-refs", ref)


def _common_dir(git_dir: Path) -> Path:
    """A worktree's refs live in the main repository (its `commondir` file says where)."""
    pointer = git_dir / "commondir"
    if pointer.is_file():
        return (git_dir / pointer.read_text().strip()).resolve()
    return git_dir


def _packed(packed_refs: Path, ref: str) -> str:
    try:
        lines = packed_refs.read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        sha, _, name = line.partition(" ")
        if name.strip() == ref and not line.startswith(("#", "^")):
            return sha
    return ""
