"""The worker's start line says at what priority a killed worker's runners die, and why."""

from __future__ import annotations

import os
import resource

import pytest

from conveyor.worker import sentinel


@pytest.mark.parametrize(("raised", "uid", "sys_nice", "rtprio", "says"), [
    (True, None, True, 0, "real-time"),
    (True, None, False, 1, "real-time"),
    (True, 4242, True, 0, "real-time"),
    (True, 4242, False, 1, "real-time, runners at ordinary priority (--uid without CAP_SYS_NICE)"),
    (False, None, False, 0, "ordinary priority (no CAP_SYS_NICE and RLIMIT_RTPRIO 0"),
    (False, None, True, 0, "ordinary priority (the kernel refused SCHED_FIFO"),
    (False, None, False, 1, "ordinary priority (the kernel refused SCHED_FIFO"),
])
def test_describe(monkeypatch: pytest.MonkeyPatch, raised: bool, uid: int | None,
                  sys_nice: bool, rtprio: int, says: str) -> None:
    monkeypatch.setattr(sentinel, "has_sys_nice", lambda: sys_nice)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (rtprio, rtprio))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    described = sentinel.describe(raised, uid)
    assert described.startswith(says)
    assert described != "real-time" or says == "real-time"


def test_has_sys_nice_reads_the_effective_set() -> None:
    with open("/proc/self/status") as status:
        eff = int(next(line for line in status if line.startswith("CapEff:")).split()[1], 16)
    assert sentinel.has_sys_nice() == bool(eff & (1 << 23))
