"""What a task runner does to itself before user code runs, so tasks cannot read each other.

Order in the runner (each step says why it sits where it does):

    slot.enter()              first, while still privileged: cgroup.procs is the worker's
    close_inherited_fds(keep) before user code can find the worker's sockets and pipes
    scrub_environment(...)    the environment a task (and anything it execs) sees
    drop_privileges(uid, gid) the kernel (commit_creds) resets dumpability to
                              fs.suid_dumpable and clears the parent-death signal on a uid
                              change; drop_privileges puts both back as they were
    make_non_dumpable()       after the drop too, so no host setting can undo it

What these steps do not do. A forked runner is a copy of its parent's memory: scrubbing
os.environ does not erase the parent's initial environment block (/proc/<pid>/environ shows
it) nor credentials held in its objects. The runner must therefore be forked from a process
that never held them (Conveyor forks runners from a zygote exec'd with a scrubbed
environment), and non-dumpable so that siblings cannot read it through /proc or ptrace.
/proc/<pid>/cmdline stays world-readable: never put secrets in argv.

Exec'd commands (command workloads). The kernel decides dumpability again at execve:
it is set to fs.suid_dumpable only if the binary is unreadable to the caller or the exec
changed credentials (setuid/setgid binary, euid != uid or egid != gid); for a plain exec it
is set back to 1. An exec'd command is therefore dumpable again: any process of the same
uid may read its /proc/<pid>/environ and /proc/<pid>/mem and ptrace it. What remains is the
cgroup cap (inherited across exec), the uid drop, the scrubbed environment and the closed
descriptors. Run command workloads under a uid of their own if tasks must not read them.
"""

from __future__ import annotations

import ctypes
import errno
import grp
import os
import pwd
import re
import resource
import signal
from collections.abc import Iterable, Mapping

from conveyor.errors import ConfigError, ConveyorError

PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4

libc = ctypes.CDLL(None, use_errno=True)  # loaded once here, not on the per-task fork path
_prctl = libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int

# A name is secret if it contains one of these anywhere (upper-cased) ...
_SECRET_PARTS = ("PASSWORD", "PASSWD", "PASSPHRASE", "PASSFILE", "SECRET", "TOKEN", "CREDENTIAL",
                 "KEY", "PRIVATE", "COOKIE")
# ... or one of these as a whole '_'-separated word ...
_SECRET_WORDS = frozenset({"PASS", "AUTH", "DSN", "SALT", "JWT"})
# ... or it names a connection to a broker or a database (FOO_DATABASE_URL, REDIS_URI, ...).
_SERVICE_URL = re.compile(
    r"(^|_)(DATABASE|DB|BROKER|REDIS|AMQP|RABBITMQ|POSTGRES|POSTGRESQL|PG|MYSQL|MARIADB|MONGO"
    r"|MONGODB|SQLALCHEMY_DATABASE|CELERY_RESULT_BACKEND|RESULT_BACKEND|KAFKA|NATS|MEMCACHED"
    r"|ELASTICSEARCH|SMTP)_?(URL|URI|ADDR|ADDRESS|CONN|CONNECTION|CONNECTION_STRING)$")
# Whatever the name: a value that carries credentials in a URL (scheme://user:pass@host).
_URL_WITH_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@")


class IsolationError(ConveyorError):
    """A runner could not isolate itself; it must not run the task without it."""


def make_non_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): no /proc/<pid>/mem, environ, ptrace for same-uid siblings.

    Non-dumpable also means no core dump and /proc/<pid> files owned by root. Call after
    drop_privileges (a uid change resets the flag) and again after any later credential
    change; an exec resets it too (see the module docstring).
    """
    if _prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise IsolationError(f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(code)}; the "
                             f"runner would be readable by other processes of its uid")
    if is_dumpable():
        raise IsolationError("prctl(PR_SET_DUMPABLE, 0) returned success but the process is "
                             "still dumpable (a seccomp filter or LSM may be faking prctl)")


def is_dumpable() -> bool:
    """Whether other processes of this uid may read this one through /proc and ptrace."""
    return bool(_prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1)


def drop_privileges(uid: int | None, gid: int | None) -> None:
    """setgroups([]), then setresgid, then setresuid (real, effective, saved all changed).

    The order matters: after the uid change the process may no longer change groups. None
    leaves that id alone; both None is a no-op. Dropping the uid while keeping gid 0 is
    refused: root's group opens files a task should not see. Verified afterwards, including
    that root cannot be regained. Calling it again with the same ids (a runner that runs
    several tasks) is a no-op, not an error.

    The kernel clears the parent-death signal and resets dumpability on a uid change; both
    are restored here, so a runner still dies with its worker and stays non-dumpable. If
    the parent died during the drop, IsolationError: the runner must not go on orphaned.
    """
    if _already(uid, gid):
        return
    if gid is None and os.getegid() == 0:
        raise IsolationError(f"refusing to drop to uid {uid} while keeping gid 0: give a gid "
                             f"too (e.g. --gid 65534)")
    parent, death_signal, dumpable = os.getppid(), _parent_death_signal(), is_dumpable()
    _switch_ids(uid, gid)
    _verify_dropped(uid, gid)
    if not dumpable:
        make_non_dumpable()
    if death_signal:
        _prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        if os.getppid() != parent:
            raise IsolationError(f"the parent (pid {parent}) exited while privileges were "
                                 f"being dropped; not running a task without its worker")


def die_with_parent(death_signal: int = signal.SIGKILL) -> None:
    """Have the kernel send `death_signal` when our parent dies: no runner outlives it.
    0 clears it."""
    if _prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0:
        raise IsolationError(f"prctl(PR_SET_PDEATHSIG) failed: "
                             f"{os.strerror(ctypes.get_errno())}")


def _parent_death_signal() -> int:
    signal_number = ctypes.c_int(0)
    _prctl(PR_GET_PDEATHSIG, ctypes.addressof(signal_number), 0, 0, 0)
    return signal_number.value


def _switch_ids(uid: int | None, gid: int | None) -> None:
    step = "setgroups([])"
    try:
        os.setgroups([])
        if gid is not None:
            step = f"setresgid({gid})"
            os.setresgid(gid, gid, gid)
        if uid is not None:
            step = f"setresuid({uid})"
            os.setresuid(uid, uid, uid)
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        raise IsolationError(f"cannot drop to uid {uid} gid {gid}: {step} failed with {name} "
                             f"({exc.strerror}); the worker runs as uid {os.getuid()}: start "
                             f"it as root to use --uid/--gid, or leave them unset") from None


def _already(uid: int | None, gid: int | None) -> bool:
    """Whether the process already runs as `uid`/`gid` with no supplementary groups."""
    if uid is None and gid is None:
        return True
    return ((uid is None or os.getresuid() == (uid, uid, uid))
            and (gid is None or os.getresgid() == (gid, gid, gid))
            and os.getgroups() in ([], [gid]))


def _verify_dropped(uid: int | None, gid: int | None) -> None:
    """Trust but verify (CERT POS37-C): ids changed, groups gone, root not regainable."""
    if uid is not None and os.getresuid() != (uid, uid, uid):
        raise IsolationError(f"uid drop to {uid} did not take: uids are {os.getresuid()}")
    if gid is not None and os.getresgid() != (gid, gid, gid):
        raise IsolationError(f"gid drop to {gid} did not take: gids are {os.getresgid()}")
    if os.getgroups() not in ([], [gid]):
        raise IsolationError(f"supplementary groups remain after the drop: {os.getgroups()}")
    if uid not in (None, 0):
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise IsolationError(f"after dropping to uid {uid} the process could become root again")


def resolve_task_user(user: str | None, group: str | None) -> tuple[int | None, int | None]:
    """--uid/--gid as given (names or numbers) -> the (uid, gid) runners drop to.

    Checked at start so a bad value stops the worker with one line instead of failing every
    task later: a user without --gid takes its primary group from its passwd entry; a uid
    with no passwd entry needs --gid; gid 0 under another uid is refused (root's group opens
    files a task should not see); a worker that is not root cannot change ids, so asking for
    other ids is refused, and asking for its own is a no-op.
    """
    if user is None and group is None:
        return None, None
    entry = _passwd_entry(user) if user is not None else None
    uid = entry.pw_uid if entry is not None else _number(user, "--uid")
    gid = _group_id(group) if group is not None else _primary_gid(user, entry)
    if gid == 0 and uid not in (None, 0):
        raise ConfigError(f"refusing to run tasks as uid {uid} with gid 0 (root's group): give "
                          f"--gid with an unprivileged group, e.g. --gid 65534")
    if os.geteuid() != 0:
        if uid in (None, os.getuid()) and gid in (None, os.getgid()):
            return None, None  # already the ids asked for: nothing to drop
        raise ConfigError(f"--uid/--gid need the worker to start as root (it runs as uid "
                          f"{os.getuid()}): start it as root, or leave them unset")
    return uid, gid


def _number(text: str | None, flag: str) -> int | None:
    if text is None:
        return None
    if not text.isdigit():
        raise ConfigError(f"{flag} {text!r}: no such user or group on this host; give a name "
                          f"from /etc/passwd or /etc/group, or a number")
    return int(text)


def _passwd_entry(user: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        return None


def _group_id(group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"--gid {group!r}: no such group in /etc/group; give a group name "
                          f"or a number") from None


def _primary_gid(user: str | None, entry: pwd.struct_passwd | None) -> int | None:
    if user is None:
        return None
    if entry is None:
        raise ConfigError(f"--uid {user} has no passwd entry to take its primary group from: "
                          f"give --gid too (e.g. --gid 65534)")
    return entry.pw_gid


def scrub_environment(env: Mapping[str, str], allow: Iterable[str] = (),
                      deny: Iterable[str] = ()) -> dict[str, str]:
    """A copy of `env` without the worker's secrets, for runners and the commands they exec.

    Removed: every CONVEYOR_* variable (broker URL, state URL, signing key), names that look
    secret (PASSWORD, SECRET, TOKEN, KEY, CREDENTIAL, AUTH, *_DSN, ...), broker and database
    connection names (DATABASE_URL, BROKER_URL, REDIS_URL, AMQP_URL, ...), any value that is a
    URL with a password in it, and the names in `deny`. Names in `allow` are kept whatever
    they look like. PATH, HOME, LANG, LC_*, TZ, PYTHONPATH, TMPDIR ... stay. Erring towards
    removal is deliberate: a task that misses a variable fails loudly; a leaked secret does
    not.
    """
    allowed, denied = frozenset(allow), frozenset(deny)
    return {name: value for name, value in env.items()
            if name in allowed or not (name in denied or is_secret(name, value))}


def is_secret(name: str, value: str = "") -> bool:
    """Whether `scrub_environment` removes this variable (without allow/deny lists)."""
    upper = name.upper()
    if upper.startswith("CONVEYOR_") or _URL_WITH_PASSWORD.match(value):
        return True
    if any(part in upper for part in _SECRET_PARTS):
        return True
    return bool(_SECRET_WORDS.intersection(upper.split("_"))) or bool(_SERVICE_URL.search(upper))


def close_inherited_fds(keep: Iterable[int] = ()) -> None:
    """Close every descriptor >= 3 except those in `keep`: nothing of the worker leaks in.

    os.closerange uses close_range(2) where the kernel has it (Linux 5.9+); the upper bound
    is the highest descriptor actually open (read from /proc/self/fd), so the fallback loop
    on older kernels stays short too.
    """
    low = 3
    for fd in sorted({fd for fd in keep if fd >= 3}):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _fd_ceiling())


def _fd_ceiling() -> int:
    """The soft RLIMIT_NOFILE: no descriptor can be at or above it.

    os.closerange is one close_range(2) call on Linux 5.9+, whatever the bound, so there
    is no need to list /proc/self/fd (which cost ~100 us on the per-task fork path).
    """
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


__all__ = ["IsolationError", "close_inherited_fds", "die_with_parent", "drop_privileges",
           "is_dumpable",
           "is_secret", "make_non_dumpable", "resolve_task_user", "scrub_environment"]
