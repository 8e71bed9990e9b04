"""Memory caps for task runners: one cgroup per lane (v2 or v1), or an RLIMIT_AS fallback.

A lane is one of the worker's slots (worker/pool.py): a fork server parked in a cgroup of
its own, and the runners it forks ahead, born inside it. One task runs in a lane at a time,
so the lane's cgroup is that task's while it runs: its cap is written when the task starts.

Why a cgroup per lane: the kernel's OOM killer then acts inside that cgroup only, so a task
that blows its cap dies alone while the worker and every other task keep running (scenario
1), and the cgroup's own `oom_kill` counter says so: the supervisor never has to guess from a
SIGKILL, which may have come from a time limit, an operator or the host.

Layout. cgroup v2 forbids a cgroup that holds processes from handing controllers to its
children ("no internal processes"), so the worker moves itself into a leaf of its own group:

    cgroup v2   <own>/conveyor-<pid>/supervisor       the worker (start helpers such as the
                                                      zygote after `detect()`, so they land
                                                      here too)
                <own>/conveyor-<pid>/task-<name>      memory.max, memory.swap.max=0,
                                                      oom.group=1; <name> is <pid>-lane<i>
    cgroup v1   <own>/conveyor-<pid>/task-<name>      memory.limit_in_bytes, then memsw

Lifecycle (supervisor unless noted):

    caps = detect()                     # once, at start
    slot = caps.prepare(name, 0)        # per lane, at start; name unique, 0 = no cap yet
    slot.enter()                        # in a freshly forked child, before user code, or
    slot.admit(runner_pid)              # from the supervisor (the rlimit fallback's runners)
    slot.set_limit(cap)                 # per task, as it starts (a file write on change)
    slot.oom_kills()                    # after each task: its increase is an OOM kill
    slot.destroy()                      # at exit: anything left in the cgroup is SIGKILLed
    caps.close()                        # at exit: kills leftovers, removes conveyor-<pid>

Cost. enter()/admit() is one write to cgroup.procs, but the kernel then takes its global
cgroup_threadgroup_rwsem for writing, which waits for an RCU grace period unless another
move happened moments before: ~0.1 ms back-to-back, 5-15 ms after an idle pause (measured
on Linux 6.18, v1 and v2 alike; benchmarks/fork_cost.py). That is why runners are born in
their lane's cgroup instead of moved into a task's, and a task's start costs only
`slot.set_limit(cap)` (a plain file write).

Without a writable memory cgroup the caps fall back to RLIMIT_AS and say once, at
WARNING, why that is weaker.

Modules: `base` (errors, file helpers, the Slot and MemoryCaps interfaces), `hierarchy` (where
this process lives; what v1 and v2 share), `v1`, `v2`, `fallback` (RLIMIT_AS and its
warning) and `detection` (`detect`). Not to be confused with flow control's
`conveyor.limits.Limiter` (keyed concurrency and rate limits across workers).
"""

from conveyor.worker.cgroups.base import CgroupError, MemoryCaps, Slot, SlotOutcome, _pids
from conveyor.worker.cgroups.detection import KINDS, detect
from conveyor.worker.cgroups.fallback import reset_fallback_warning

__all__ = ["KINDS", "CgroupError", "MemoryCaps", "Slot", "SlotOutcome", "_pids", "detect",
           "reset_fallback_warning"]
