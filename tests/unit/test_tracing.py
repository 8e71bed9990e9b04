"""conveyor.tracing without a collector: modes, W3C ids, the ids a DAG run's spans derive
from its id, and what happens when the extra is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conveyor import tracing
from conveyor.config import Settings
from conveyor.context import TaskContext
from conveyor.errors import ConfigError


@pytest.mark.parametrize(("text", "expected"), [
    ("off", "off"), ("OTLP", "otlp"), (" console ", "console"),
    ("tests.tracing_export:exporter", "tests.tracing_export:exporter"),
])
def test_modes(text: str, expected: str) -> None:
    assert tracing.mode(text) == expected


@pytest.mark.parametrize("text", ["jaeger", "module:", ":factory", "a-b:c", ""])
def test_a_wrong_mode_says_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match="off, console, otlp, or module:callable"):
        tracing.mode(text)
    with pytest.raises(ConfigError, match="CONVEYOR_TRACING="):
        tracing.configure(text, "test")


def test_tracing_is_a_setting_and_off_by_default() -> None:
    assert Settings().tracing == "off"
    assert Settings.from_env({"CONVEYOR_TRACING": "otlp"}).tracing == "otlp"


def test_traceparent_round_trip() -> None:
    header = tracing.traceparent(0xABC, 0x12)
    assert header == "00-00000000000000000000000000000abc-0000000000000012-01"
    assert tracing.parse_traceparent(header) == (0xABC, 0x12, True)
    for bad in ("", "00-abc-12-01", "ff-" + header[3:], header.replace("abc", "xyz"),
                "00-" + "0" * 32 + "-0000000000000012-01"):
        assert tracing.parse_traceparent(bad) is None


def test_a_runs_ids_are_the_same_everywhere_and_its_task_instances_share_its_trace() -> None:
    trace_id, span_id = tracing.run_ids("run-1")
    assert tracing.run_ids("run-1") == (trace_id, span_id) != tracing.run_ids("run-2")
    first, retry = (tracing.task_instance_ids("run-1", "ti-1", n) for n in (1, 2))
    assert first[0] == retry[0] == trace_id
    assert len({first[1], retry[1], span_id}) == 3
    assert 0 < trace_id < 2**128 and 0 < span_id < 2**64


def test_off_is_the_default_and_imports_nothing() -> None:
    code = ("import sys; from conveyor import tracing\n"
            "assert tracing.configure('off', 'x') is None and tracing.current() is None\n"
            "print(any(m.startswith('opentelemetry') for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_without_the_extra_turning_it_on_says_how_to_install_it() -> None:
    code = ("import sys; sys.modules['opentelemetry'] = None\n"
            "from conveyor import tracing\n"
            "tracing.configure('console', 'x')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "pip install 'conveyor[otel]'" in done.stderr


def test_otel_sdk_disabled_keeps_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.configure("console", "x") is None and tracing.current() is None


def test_a_command_task_gets_its_trace_context_as_TRACEPARENT() -> None:
    header = tracing.traceparent(1, 2)
    ctx = TaskContext.from_wire({"id": "m", "headers": {"traceparent": header}})
    assert ctx.traceparent == header and ctx.as_environment()["TRACEPARENT"] == header
    assert "TRACEPARENT" not in TaskContext.from_wire({"id": "m"}).as_environment()
