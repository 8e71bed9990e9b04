#!/usr/bin/env python
"""Where a fresh runner's task spends its time, from hand-off to ack, on the real path.

usage: python benchmarks/runner_breakdown.py [--n 300] [--reuse 1] [--init-hook]
       (PYTHONPATH must hold benchmarks/, this file is also the worker's task module)

It queues `--n` tasks on Redis whose body is what a typical task does: open its own Redis
client and INCR one key (as the peer benchmarks' no-op does). A real `conveyor worker -c 2
--burst` drains them twice: once untraced (the rate), once under `strace -f --seccomp-bpf`
tracing only the syscalls that mark a phase (the others run at full speed; each traced
one costs a few tens of µs, so absolute figures are inflated: read them as shares). Printed
per phase: median and p90 in ms, over all tasks.

  hand-off             supervisor sends the task frame -> the runner has read it
  runner until connect runner's own work before its task's first connect(): privilege
                       drop, non-dumpable, task lookup, the client library's lazy set-up
  connection set-up    connect() -> the task's command is sent (handshake round trips)
  task command         the INCR round trip
  to report            INCR reply -> report frame sent
  report seen          report sent -> the supervisor's watcher has read it
  exit teardown        exit_group -> the kernel says the runner exited
  reap + notify        exited -> the supervisor's watcher reads the lane's "exited" frame
  ack sent after       report sent -> the supervisor sends the ack (its own work + waiting)
  ack round trip       ack sent -> ack reply read
  fork (lane)          the lane's fork() of the next runner, start to return
  slot cycle           a task's hand-off -> the next hand-off in the same lane
  slot idle            report sent -> the next hand-off in the same lane (the slot's dead
                       time: what isolation costs per task beyond the task itself)

With --init-hook the tasks' client is opened by a `worker_process_init` hook in the idle
runner, before its task arrives (see the README's Performance section).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from typing import Any

import redis

from conveyor import broker as brokers
from conveyor.client import Client
from conveyor.tasks import task

COUNTER_URL = os.environ.get("BREAKDOWN_COUNTER_URL", "redis://127.0.0.1:6379/15")
KEY = "breakdown:done"
_client: Any = None


def _counter() -> Any:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(COUNTER_URL)
    return _client


if os.environ.get("BREAKDOWN_INIT_HOOK") == "1":
    from conveyor.tasks import worker_process_init

    @worker_process_init
    def _open_counter() -> None:
        _counter().ping()


@task(name="breakdown.incr", queue="breakdown")
def incr() -> None:
    _counter().incr(KEY)


TRACED = "clone,clone3,exit_group,wait4,sendmsg,recvmsg,connect,sendto,recvfrom"
LINE = re.compile(r"^(\d+) +(\d+\.\d+) (.*)$")
#: A task frame as strace prints it: marshal (worker/frames.send_task: "M", then the dict's
#: first key, the 7-character string 'message') or, when marshal cannot carry it, JSON.
TASK_FRAME = ("\\7message", '{\\"message\\"')


def _task_frame(text: str) -> bool:
    return any(mark in text for mark in TASK_FRAME)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--reuse", type=int, default=1, help="--max-tasks-per-child")
    parser.add_argument("--init-hook", action="store_true")
    args = parser.parse_args()
    env = {**os.environ, "BREAKDOWN_INIT_HOOK": "1" if args.init_hook else "0"}
    rate = drain(args, env, traced=None)
    hook = 'on' if args.init_hook else 'off'
    print(f"untraced: {args.n} tasks in {args.n / rate:.2f} s = {rate:.0f} tasks/s "
          f"(-c 2, --max-tasks-per-child={args.reuse}, init hook {hook})")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace")
        drain(args, env, traced=trace)
        with open(trace) as f:
            phases = analyse(f.read().splitlines())
    print(f"{'phase (strace-inflated)':<24}{'median ms':>10}{'p90 ms':>9}{'count':>7}")
    for name, values in phases.items():
        if values:
            values.sort()
            p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
            print(f"{name:<24}{statistics.median(values):>10.3f}{p90:>9.3f}{len(values):>7}")


def drain(args: argparse.Namespace, env: dict[str, str], traced: str | None) -> float:
    """Queue the tasks, run a burst worker until they are done; tasks/s from its start."""
    prefix = f"breakdown{uuid.uuid4().hex[:8]}"
    url = f"redis://127.0.0.1:6379/0?prefix={prefix}"
    queue = "breakdown"
    client = Client(brokers.from_url(url))
    counter = redis.Redis.from_url(COUNTER_URL)
    counter.delete(KEY)
    for _ in range(args.n):
        client.enqueue(incr.message())
    cmd = [sys.executable, "-m", "conveyor.cli", "worker", "-A", "runner_breakdown", "-Q",
           queue, "-c", "2", "--burst", f"--max-tasks-per-child={args.reuse}",
           "--log-level=WARNING"]
    if traced:
        cmd = ["strace", "-f", "-ttt", "-s", "96", "--seccomp-bpf", "-e", f"trace={TRACED}",
               "-o", traced, *cmd]
    start = time.perf_counter()
    subprocess.run(cmd, env={**env, "CONVEYOR_BROKER_URL": url}, check=True, timeout=600)
    elapsed = time.perf_counter() - start
    done = int(counter.get(KEY) or 0)
    client.broker.purge(queue)
    server = redis.Redis(host="127.0.0.1", port=6379, db=0)
    for key in server.scan_iter(f"{prefix}:*"):
        server.delete(key)
    if done != args.n:
        raise SystemExit(f"only {done} of {args.n} tasks ran")
    return args.n / elapsed


def _script_sha(name: str) -> str:
    from conveyor.broker.redis import script_source
    return hashlib.sha1(script_source(name).encode()).hexdigest()


def analyse(lines: list[str]) -> dict[str, list[float]]:
    """Phase durations (ms) per task from an `strace -f -ttt` log (see the docstring)."""
    ev: dict[int, list[tuple[float, str]]] = defaultdict(list)
    pending: dict[int, str] = {}
    for raw in lines:
        m = LINE.match(raw)
        if not m:
            continue
        pid, ts, rest = int(m[1]), float(m[2]), m[3]
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest
            if "sendto(" in rest or "sendmsg(" in rest or "clone" in rest:
                ev[pid].append((ts, "start " + rest))
            continue
        if rest.startswith("<... "):
            rest = pending.pop(pid, "") + " " + rest
        ev[pid].append((ts, rest))
    return _phases(ev, _script_sha("ack"))


def _first(events: list[tuple[float, str]], needle: str, after: float = 0.0) -> float | None:
    for ts, text in events:
        if ts >= after and needle in text and not text.startswith("start "):
            return ts
    return None


def _runners(ev: dict[int, list[tuple[float, str]]]) -> dict[int, float]:
    """Runner pid -> time it read its task frame."""
    out = {}
    for pid, events in ev.items():
        for ts, text in events:
            if text.startswith("recvfrom(") and _task_frame(text):
                out[pid] = ts
                break
    return out


def _phases(ev: dict[int, list[tuple[float, str]]], ack_sha: str) -> dict[str, list[float]]:
    names = ["hand-off", "runner until connect", "connection set-up", "task command",
             "to report", "report seen", "exit teardown", "reap + notify", "ack sent after",
             "ack round trip", "fork (lane)", "slot cycle", "slot idle"]
    out: dict[str, list[float]] = {n: [] for n in names}
    runners = _runners(ev)
    lane_of: dict[int, int] = {}
    for pid, events in ev.items():
        for ts, text in events:
            m = re.search(r"clone\(.*\) = (\d+)$", text)
            if m and text.startswith("clone"):
                lane_of[int(m[1])] = pid
                start = next((t for t, x in reversed(events) if x.startswith("start clone")
                              and t <= ts), None)
                if start is not None and int(m[1]) in runners:
                    out["fork (lane)"].append((ts - start) * 1e3)
    sends = sorted(ts for events in ev.values() for ts, text in events
                   if text.startswith(("start sendto(", "sendto(")) and _task_frame(text))
    acks = sorted((ts, pid) for pid, events in ev.items() for ts, text in events
                  if ("sendto(" in text and ack_sha in text))
    reports_seen = sorted(ts for events in ev.values() for ts, text in events
                          if text.startswith("recvfrom(") and '{\\"outcome\\"' in text
                          and '= 0' not in text[-4:])
    by_lane: dict[int, list[int]] = defaultdict(list)
    for pid in sorted(runners, key=runners.get):  # type: ignore[arg-type]
        by_lane[lane_of.get(pid, 0)].append(pid)
    for lane, pids in by_lane.items():
        for i, pid in enumerate(pids):
            _runner_phases(out, ev, pid, runners[pid], sends, acks, reports_seen,
                           runners.get(pids[i + 1]) if i + 1 < len(pids) else None, lane)
    return out


def _runner_phases(out: dict[str, list[float]], ev: dict[int, list[tuple[float, str]]],
                   pid: int, t_recv: float, sends: list[float], acks: list[tuple[float, int]],
                   reports_seen: list[float], t_next: float | None, lane: int) -> None:
    events = ev[pid]

    def add(name: str, a: float | None, b: float | None) -> None:
        if a is not None and b is not None and b >= a:
            out[name].append((b - a) * 1e3)

    sent = max((s for s in sends if s <= t_recv), default=None)
    t_conn = _first(events, "connect(", t_recv)
    t_cmd = _first(events, "INCR", t_recv)
    t_reply = _first(events, "recvfrom(", t_cmd or t_recv)
    t_report = _first(events, '{\\"outcome\\"', t_recv)
    t_exit = _first(events, "exit_group(", t_recv)
    t_exited = _first(events, "+++ exited", t_recv)
    add("hand-off", sent, t_recv)
    add("runner until connect", t_recv, t_conn)
    add("connection set-up", t_conn, t_cmd)
    add("task command", t_cmd, t_reply)
    add("to report", t_reply, t_report)
    seen = min((s for s in reports_seen if t_report is not None and s >= t_report), default=None)
    add("report seen", t_report, seen)
    add("exit teardown", t_exit, t_exited)
    notified = min((ts for events_ in ev.values() for ts, text in events_
                    if text.startswith("recvmsg(") and f'\\"pid\\":{pid},' in text
                    and "exited" in text), default=None)
    add("reap + notify", t_exited, notified)
    ack = min(((ts, p) for ts, p in acks if t_report is not None and ts >= t_report),
              default=None)
    if ack is not None:
        add("ack sent after", t_report, ack[0])
        add("ack round trip", ack[0], _first(ev[ack[1]], "recvfrom(", ack[0]))
    add("slot cycle", t_recv, t_next)
    add("slot idle", t_report, t_next)


if __name__ == "__main__":
    main()
