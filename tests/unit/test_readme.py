"""The README's configuration reference is generated from the settings, and the images it
shows are in the repository: neither can drift."""

from __future__ import annotations

import argparse
import re
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


def test_every_flag_the_reference_names_is_one_its_commands_take() -> None:
    """`up --port` was in the reference while `up` takes --ui-port: each (command, flag) the
    README's table names must be a flag that command's parser accepts."""
    parser, _ = cli.build_parser()
    for row in configuration.section(README.read_text()).splitlines()[2:]:
        _, key, _, flags, _, commands, *_ = (cell.strip() for cell in row.split("|"))
        for command in (c.strip() for c in commands.split(",") if c.strip() != "all"):
            for flag in _flags_of(flags, command):
                assert flag in _options(parser, command), f"{key}: conveyor {command} {flag}"


def _flags_of(cell: str, command: str) -> list[str]:
    """The flags a reference cell gives `command` ("`--port`" or "ui: `--port`; up: …")."""
    if ": " in cell:
        per = dict(part.split(": ", 1) for part in cell.split("; "))
        cell = per.get(command, "")
    return [f.strip("` ") for f in cell.split(",") if f.strip("` ")]


def _options(parser: argparse.ArgumentParser, command: str) -> set[str]:
    for word in command.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return {o for action in parser._actions for o in action.option_strings}


def test_every_image_the_readme_shows_is_in_the_repository() -> None:
    """The Dashboard section shows its pages as screenshots under docs/."""
    images = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", README.read_text())
    assert {"docs/dashboard.png", "docs/dashboard-actions.png", "docs/dashboard-waiting.png",
            "docs/dashboard-queues.png", "docs/dashboard-limits.png"} <= set(images), images
    missing = [image for image in images if not (README.parent / image).is_file()]
    assert not missing, f"README.md shows images that are not there: {missing}"
