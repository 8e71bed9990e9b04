#!/usr/bin/env python3
"""The flow-control rate test's span, measured many times per backend.

    .venv/bin/python benchmarks/rate_span.py [--rounds 10] [--backends sqlite,rabbitmq,...]

What the rate test of `tests/integration/test_flow_control.py` does (100 tasks of a
`Rate(per_second=10)` key on 2 real `conveyor worker --burst` processes), repeated; rounds
interleave the backends so a busy machine skews them alike. Per round: the span (first start
to last end; the issue asks 9.5-11 s) and how late the starts were against the ideal grid
(first start + 0.1 s * i): the largest and the median. Prints the load average with every
figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from conveyor.broker import from_url  # noqa: E402
from tests import flow_tasks  # noqa: E402
from tests.conftest import clean_transport, drop_postgres_schema  # noqa: E402
from tests.integration.test_flow_control import (  # noqa: E402
    SETUPS,
    enqueue_all,
    ledger_lines,
    run_all,
)


def one_round(backend: str) -> tuple[float, float, float]:
    """(span, largest start lateness, median start lateness) of one run on `backend`."""
    _, url_t, extra_t = SETUPS[backend]
    name = "r" + uuid.uuid4().hex[:12]
    with tempfile.TemporaryDirectory() as tmp:
        url = url_t.format(tmp=tmp, name=name)
        extra = {k: v.format(tmp=tmp, name=name) for k, v in extra_t.items()}
        ledger = Path(tmp) / "ledger"
        try:
            with from_url(url) as broker:
                enqueue_all(broker, [flow_tasks.rated_job.message((str(ledger),), queue=name)
                                     for _ in range(100)])
            outputs = run_all(url, name, 2, extra, ledger, 100)
            lines = ledger_lines(ledger)
        finally:
            clean_transport(backend, name)
            if "CONVEYOR_STATE_URL" in extra_t:
                drop_postgres_schema(name)
    starts = sorted(at for what, at, _ in lines if what == "S")
    ends = sorted(at for what, at, _ in lines if what == "E")
    if len(ends) != 100:
        raise SystemExit(f"{backend}: {len(ends)} of 100 ended\n{outputs[0][-3000:]}")
    late = [at - (starts[0] + 0.1 * i) for i, at in enumerate(starts)]
    return ends[-1] - starts[0], max(late), statistics.median(late)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--backends", default=",".join(SETUPS))
    args = parser.parse_args()
    backends = args.backends.split(",")
    spans: dict[str, list[float]] = {b: [] for b in backends}
    for n in range(args.rounds):
        for backend in backends:
            span, worst, median = one_round(backend)
            spans[backend].append(span)
            print(f"round {n + 1} {backend:9} span {span:6.2f} s  start late: max "
                  f"{worst:5.2f} s, median {median:5.2f} s  load {os.getloadavg()[0]:.1f}",
                  flush=True)
    print("\nbackend    min    median max   (span, s; the issue asks 9.5-11)")
    for backend, values in spans.items():
        print(f"{backend:9} {min(values):6.2f} {statistics.median(values):6.2f} "
              f"{max(values):6.2f}   all: {' '.join(f'{v:.2f}' for v in sorted(values))}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}, "
          f"{time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
