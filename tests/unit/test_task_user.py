"""`--uid`/`--gid`: names or numbers, the primary group from passwd, one line when wrong.

These read the real /etc/passwd and /etc/group (root, nobody and daemon exist on every
Debian-like system this project supports). The not-root case runs in a forked child that
gave up root, so the rule "a worker that is not root cannot change ids" is checked for real.
"""

from __future__ import annotations

import os
import pwd

import pytest

from conveyor.errors import ConfigError
from conveyor.worker.isolation import resolve_task_user

NOBODY = pwd.getpwnam("nobody")


def _free_uid() -> int:
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    return next(uid for uid in range(40000, 50000) if uid not in taken)


def test_nothing_asked_nothing_dropped() -> None:
    assert resolve_task_user(None, None) == (None, None)


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: a non-root worker refuses ids")
@pytest.mark.parametrize("user, group", [("nobody", None), (str(NOBODY.pw_uid), None),
                                         ("nobody", str(NOBODY.pw_gid))])
def test_a_user_takes_its_primary_group_unless_one_is_given(user: str, group: str | None
                                                            ) -> None:
    assert resolve_task_user(user, group) == (NOBODY.pw_uid, NOBODY.pw_gid)


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: a non-root worker refuses ids")
@pytest.mark.parametrize("user, group, says", [
    ("no-such-user-xq", None, "--uid 'no-such-user-xq': no such user"),
    ("nobody", "no-such-group-xq", "--gid 'no-such-group-xq': no such group"),
    ("nobody", "0", "with gid 0 (root's group)"),
    ("FREE", None, "has no passwd entry to take its primary group from: give --gid"),
])
def test_bad_ids_stop_the_worker_with_one_line(user: str, group: str | None, says: str) -> None:
    user = str(_free_uid()) if user == "FREE" else user
    with pytest.raises(ConfigError) as caught:
        resolve_task_user(user, group)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_worker_that_is_not_root_refuses_other_ids_and_accepts_its_own() -> None:
    """Checked in a child that is not root (or in this process if it is not root already)."""
    if os.geteuid() != 0:
        _check_as_non_root()
        return
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setresgid(NOBODY.pw_gid, NOBODY.pw_gid, NOBODY.pw_gid)
            os.setresuid(NOBODY.pw_uid, NOBODY.pw_uid, NOBODY.pw_uid)
            _check_as_non_root()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _check_as_non_root() -> None:
    me = pwd.getpwuid(os.getuid())
    assert resolve_task_user(me.pw_name, None) == (None, None)
    other = "daemon" if me.pw_name != "daemon" else "nobody"
    try:
        resolve_task_user(other, None)
    except ConfigError as exc:
        assert "need the worker to start as root" in str(exc)
    else:
        raise AssertionError("a non-root worker accepted another uid")
