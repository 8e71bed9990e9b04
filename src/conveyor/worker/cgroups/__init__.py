"""Memory caps for task runners: one cgroup per task (v2 or v1), or an RLIMIT_AS fallback.

Why a cgroup per task: the kernel's OOM killer then acts inside that cgroup only, so a task
that blows its cap dies alone while the worker and every other task keep running (scenario
1), and the cgroup's own `oom_kill` counter says so: the supervisor never has to guess from a
SIGKILL, which may have come from a time limit, an operator or the host.

Layout. cgroup v2 forbids a cgroup that holds processes from handing controllers to its
children ("no internal processes"), so the worker moves itself into a leaf of its own group:

    cgroup v2   <own>/conveyor-<pid>/supervisor    the worker (start helpers such as the zygote
                                                   after `detect()`, so they land here too)
                <own>/conveyor-<pid>/task-<name>   memory.max, memory.swap.max=0, oom.group=1
    cgroup v1   <own>/conveyor-<pid>/task-<name>   memory.limit_in_bytes, then memsw

Lifecycle (supervisor unless noted):

    limiter = detect()                  # once, at start
    slot = limiter.prepare(name, cap)   # per task; name unique per task, cap 0 = no cap
    slot.enter()                        # in a freshly forked child, before user code, or
    slot.admit(runner_pid)              # from the supervisor, for a runner forked ahead
    slot.outcome()                      # after the runner exited or reported
    slot.remove()                       # an admitted runner still alive goes back home;
                                        # anything else left in the cgroup is SIGKILLed
    limiter.close()                     # at exit: kills leftovers, removes conveyor-<pid>

Cost. enter()/admit() is one write to cgroup.procs, but the kernel then takes its global
cgroup_threadgroup_rwsem for writing, which waits for an RCU grace period unless another
move happened moments before: ~0.1 ms back-to-back, 5-15 ms after an idle pause (measured
on Linux 6.18, v1 and v2 alike; benchmarks/fork_cost.py). To keep that off a task's start,
prepare and admit a slot while its runner is forked ahead and call `slot.set_limit(cap)`
(a plain file write) when the task arrives.

Without a writable memory cgroup the limiter falls back to RLIMIT_AS and says once, at
WARNING, why that is weaker.

Modules: `base` (errors, file helpers, the Slot and Limiter interfaces), `hierarchy` (where
this process lives; what v1 and v2 share), `v1`, `v2`, `fallback` (RLIMIT_AS and its
warning) and `detection` (`detect`).
"""

from conveyor.worker.cgroups.base import CgroupError, Limiter, Slot, SlotOutcome, _pids
from conveyor.worker.cgroups.detection import KINDS, detect
from conveyor.worker.cgroups.fallback import reset_fallback_warning

__all__ = ["KINDS", "CgroupError", "Limiter", "Slot", "SlotOutcome", "_pids", "detect",
           "reset_fallback_warning"]
