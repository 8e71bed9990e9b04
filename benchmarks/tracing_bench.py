"""What tracing costs per task: off (against the code before tracing existed) and on.

    .venv/bin/python benchmarks/tracing_bench.py [--n 400] [--rounds 3] [--base REV]

Each configuration enqueues `--n` no-op tasks from a client process of its own, then a real
`conveyor worker -c 2 --burst` (a fresh runner per task, the default) drains them, on Redis:

  base        the code at REV (default: the commit before tracing came in), no tracing at all
  off         this checkout, CONVEYOR_TRACING=off (the default)
  on          this checkout, tracing on: every span made by the SDK and handed to a batch
              processor whose exporter drops them (the SDK's cost, not a collector's)

Rounds interleave the configurations (base, off, on, base, off, on, ...) so a shared
machine's load falls on all of them alike. Printed per configuration: the median and the
best round of the client's µs per enqueue and the worker's ms per task (burst wall time / n);
on a loaded machine the best round is the steadier figure.

End-to-end figures on a shared machine move by more than tracing costs, so it also times
the hooks themselves in this process (no broker): the check every hook makes while tracing
is off, and, on, one task's whole set of spans (enqueue, claim, run, outcome) handed to the
dropping batch processor.

And the road not taken for the run span: a runner making and exporting it itself. Runners
are fresh forks that exit right after their report, so a batch processor would lose the
span; the runner would have to load the SDK (or find it preloaded in the zygote), set up a
provider and export synchronously before exiting. Timed over forked children: the SDK
imported in each child, and preloaded before the fork, against what runners do instead
(two clock reads, the times sent in the report frame).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from conveyor.tasks import task

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "tracing-bench"
REDIS = "redis://127.0.0.1:6379/0?prefix={prefix}"


@task(name="tracing_bench.noop", queue=QUEUE)
def noop() -> None:
    return None


def null_exporter() -> Any:
    """CONVEYOR_TRACING=tracing_bench:null_exporter: batched, then dropped."""
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Null(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return BatchSpanProcessor(Null())


ENQUEUE = """
import sys, time
from conveyor.client import default_client
from conveyor.message import Message
client = default_client()
n = int(sys.argv[1])
started = time.perf_counter()
for _ in range(n):
    client.enqueue(Message(queue={queue!r}, task="tracing_bench.noop"))
print((time.perf_counter() - started) / n * 1e6)
"""


def env_for(src: Path, prefix: str, tracing: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVEYOR_", "OTEL_"))}
    env.update(CONVEYOR_BROKER_URL=REDIS.format(prefix=prefix),
               PYTHONPATH=f"{src}:{ROOT / 'benchmarks'}", CONVEYOR_LOG_LEVEL="WARNING")
    if tracing:   # the base knows no such setting
        env["CONVEYOR_TRACING"] = tracing
    return env


def one_round(src: Path, tracing: str, n: int) -> tuple[float, float]:
    """(µs per enqueue, ms per task drained) for one configuration."""
    prefix = f"tracing-bench-{uuid.uuid4().hex[:8]}"
    env = env_for(src, prefix, tracing)
    try:
        out = subprocess.run([sys.executable, "-c", ENQUEUE.format(queue=QUEUE), str(n)],
                             env=env, capture_output=True, text=True, check=True)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "conveyor.cli", "worker", "-A", "tracing_bench",
                        "-Q", QUEUE, "-c", "2", "--burst"], env=env, check=True,
                       stdout=subprocess.DEVNULL, cwd=ROOT)
        return float(out.stdout), (time.perf_counter() - started) / n * 1e3
    finally:
        purge(prefix)


def purge(prefix: str) -> None:
    import redis
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()


def before_tracing() -> str:
    """The commit before the one that added conveyor/tracing."""
    added = subprocess.run(["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H",
                            "--", "src/conveyor/tracing/__init__.py"], check=True,
                           capture_output=True, text=True).stdout.split()[-1]
    return f"{added[:10]}~1"


def base_source(rev: str, into: Path) -> Path:
    """The src/ tree of `rev`, exported into `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def micro(repeat: int = 20000) -> tuple[float, float]:
    """(ns per off check, µs per task's spans with tracing on), in this process."""
    import timeit

    from conveyor import tracing
    from conveyor.message import Message
    off = min(timeit.repeat("current() is None", globals={"current": tracing.current},
                            number=repeat, repeat=5)) / repeat * 1e9
    tracer = tracing.configure("__main__:null_exporter", "bench")
    assert tracer is not None
    message = Message(queue=QUEUE, task="tracing_bench.noop")
    report = {"outcome": "succeeded", "result": None, "span": [time.time_ns()] * 2}

    def one_task() -> None:
        with tracer.producing(message) as sent:
            pass
        claim = tracer.claimed(sent, QUEUE, "host")
        claim.starting()
        claim.ran(report, "succeeded", "", {}, 1)
        claim.settled("ack", "")

    on = min(timeit.repeat(one_task, number=repeat // 10, repeat=5)) / (repeat // 10) * 1e6
    tracing.shutdown()
    return off, on


def forked(body: Any, n: int) -> float:
    """ms per forked child running `body`, fork and reaping included."""
    started = time.perf_counter()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                body()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    return (time.perf_counter() - started) / n * 1e3


def runner_side(n: int = 40) -> dict[str, float]:
    """Extra ms per runner for each way of making the run span (see the docstring)."""
    code = ("from opentelemetry.sdk.trace import TracerProvider\n"
            "from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, "
            "SpanExportResult\n"
            "class Null(SpanExporter):\n"
            "    def export(self, spans): return SpanExportResult.SUCCESS\n"
            "provider = TracerProvider()\n"
            "provider.add_span_processor(SimpleSpanProcessor(Null()))\n"
            "provider.get_tracer('conveyor').start_span('run').end()\n"
            "provider.shutdown()\n")

    def report_frame() -> None:
        [time.time_ns(), time.time_ns()]

    base = forked(report_frame, n)
    cold = forked(lambda: exec(code, {}), max(5, n // 8)) - base
    import opentelemetry.sdk.trace  # noqa: F401 - preloaded, as a zygote would
    import opentelemetry.sdk.trace.export  # noqa: F401
    warm = forked(lambda: exec(code, {}), n) - base
    return {"SDK imported in the runner": cold, "SDK preloaded in the zygote": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default="")
    args = parser.parse_args()
    rev = args.base or before_tracing()
    with tempfile.TemporaryDirectory() as tmp:
        configs = {"base": (base_source(rev, Path(tmp)), ""),
                   "off": (ROOT / "src", "off"),
                   "on": (ROOT / "src", "tracing_bench:null_exporter")}
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
        for _ in range(args.rounds):
            for name, (src, tracing) in configs.items():
                figures[name].append(one_round(src, tracing, args.n))
    for way, ms in runner_side().items():
        print(f"run span made in the runner, {way}: +{ms:.1f} ms per task")
    off, on = micro()
    print(f"hooks, in process: off {off:.0f} ns per check (about 6 per task); on {on:.0f} µs "
          "per task for its 4 spans")
    print(f"{args.n} no-op tasks, worker -c 2, Redis, median of {args.rounds} rounds "
          f"(base: {rev})")
    print(f"{'':6} {'enqueue µs/msg (median, best)':>30} {'worker ms/task (median, best)':>30}")
    for name, rows in figures.items():
        enq, ran = [r[0] for r in rows], [r[1] for r in rows]
        print(f"{name:6} {statistics.median(enq):21.1f} {min(enq):8.1f} "
              f"{statistics.median(ran):21.2f} {min(ran):8.2f}")


if __name__ == "__main__":
    main()
