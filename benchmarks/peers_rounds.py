#!/usr/bin/env python
"""Conveyor beside its peers, as ratios from interleaved rounds of one sitting.

usage: python benchmarks/peers_rounds.py [--rounds 2] [--n 1500] [--lat-n 300]
                                         [--brokers redis,rabbitmq] [--peers]

Run it with the peers' venv (`../shared/peers/setup.sh`, then `pip install -e .` into it);
`PYTHONPATH` must hold this folder and `../shared/peers`, and `BENCH_COUNTER_URL` a Redis
database nobody else uses. Each round runs `bench.py CONFIG --runs 1` for Celery prefork
and every Conveyor configuration of each broker, one after the other (with `--peers`, also
Dramatiq and RQ), so the machine's load is shared alike; ratios are taken inside a round,
against Celery on the same broker, because on a shared 2-core machine figures from two
sittings do not compare. Printed: one Markdown table with each configuration's range over
the rounds, its ratios per round, and the latency at 50 tasks/s; `uptime`'s load before
each round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

#: ../shared/peers beside the project (PEERS_DIR from a git worktree elsewhere)
PEERS = Path(os.environ.get("PEERS_DIR") or
             Path(__file__).resolve().parents[2] / "shared" / "peers")
CONVEYOR = {"": "default (fresh runner per task)", "-init": "default, `-init` hook",
            "-reuse100": "`--max-tasks-per-child=100`"}
OTHERS = {"redis": ["dramatiq-redis-t8", "rq-fork"], "rabbitmq": ["dramatiq-rabbitmq-t8"]}


@dataclass
class Row:
    """One configuration's figures over the rounds."""

    label: str
    rates: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)


def configs(broker: str, peers: bool) -> list[tuple[str, str]]:
    """(bench.py config, label) in the order a round runs them: Celery first."""
    out = [(f"celery-{broker}", "Celery prefork `-c 2`")]
    out += [(f"module:p_conveyor:{broker}{v}", f"Conveyor {label}")
            for v, label in CONVEYOR.items()]
    out += [(name, name) for name in (OTHERS.get(broker, []) if peers else [])]
    return out


def run_one(config: str, args: argparse.Namespace, results: str) -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "PEERS_RESULTS": results}
    cmd = [sys.executable, str(PEERS / "bench.py"), config, "--runs", "1",
           "--n", str(args.n), "--lat-n", str(args.lat_n)]
    subprocess.run(cmd, env=env, check=False, stdout=sys.stderr, stderr=sys.stderr)
    path = Path(results) / f"{config.replace(':', '_')}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def span(values: list[float], fmt: str = "{:,.0f}") -> str:
    if not values:
        return "–"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}–{fmt.format(hi)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--lat-n", type=int, default=300)
    ap.add_argument("--brokers", default="redis,rabbitmq")
    ap.add_argument("--peers", action="store_true", help="also Dramatiq and RQ")
    args = ap.parse_args()
    rows: dict[tuple[str, str], Row] = {}
    loads = []
    for round_no in range(args.rounds):
        loads.append(load())
        for broker in args.brokers.split(","):
            results = tempfile.mkdtemp(prefix=f"peers-{broker}-{round_no}-")
            base = None
            for config, label in configs(broker, args.peers):
                out = run_one(config, args, results)
                row = rows.setdefault((broker, config), Row(label))
                rate = next((r["rate"] for r in out.get("runs", []) if "rate" in r), None)
                if rate is not None:
                    row.rates.append(rate)
                    base = rate if config.startswith("celery") else base
                    if base:
                        row.ratios.append(rate / base)
                for lat in out.get("latency", []):
                    if "p50_ms" in lat:
                        row.p50.append(lat["p50_ms"])
                        row.p99.append(lat["p99_ms"])
    print(f"\n{args.rounds} interleaved rounds of {args.n:,} tasks; load average at the start "
          f"of each round: {'; '.join(loads)}\n")
    print("| broker | configuration (2 slots) | drain tasks/s | ÷ Celery, per round "
          "| latency p50 / p99 ms at 50 tasks/s |")
    print("|---|---|---|---|---|")
    for (broker, _), row in rows.items():
        ratios = ", ".join(f"{r:.2f}" for r in row.ratios) or "–"
        print(f"| {broker} | {row.label} | {span(row.rates)} | {ratios} | "
              f"{span(row.p50, '{:.1f}')} / {span(row.p99, '{:.1f}')} |")


if __name__ == "__main__":
    main()
