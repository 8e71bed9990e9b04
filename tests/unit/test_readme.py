"""The README's configuration reference is generated from the settings: it cannot drift."""

from __future__ import annotations

from pathlib import Path

from conveyor import cli
from conveyor.cli import configuration

README = Path(__file__).parents[2] / "README.md"


def test_configuration_reference_is_what_the_generator_prints() -> None:
    _, catalog = cli.build_parser()
    assert configuration.section(README.read_text()) == configuration.reference(catalog), (
        "README.md's configuration reference is out of date: run "
        "`conveyor config reference --write README.md`")


def test_the_readme_starts_with_the_two_commands() -> None:
    commands = [line for line in README.read_text().splitlines()[:6] if line.startswith("./")]
    assert [c.split()[0] for c in commands] == ["./scripts/run.sh", "./scripts/test.sh"]
    assert "up" in (README.parents[0] / "scripts/run.sh").read_text().split()[-2]
    assert "scripts/test.sh" in (README.parents[0] / ".ci/run").read_text()
