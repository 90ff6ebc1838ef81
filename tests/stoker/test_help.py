"""Every verb's --help as a user reads it at 80 columns, and as a CI log holds it (no terminal):
an example of the verb, and nothing cut. At 80 columns rich's option table cut
`--prefill-ms-per-token` to `--prefill-ms-per-tok…` and no verb showed an example; usage lines
showed `{log}` and option values `<list[str]>`."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest
import typer
from typer.testing import CliRunner

from stoker.cli import app
from tests.cli import run_stoker

runner = CliRunner()


def _verbs() -> Iterator[tuple[list[str], click.Command]]:
    def walk(cmd: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        yield path, cmd
        if hasattr(cmd, "list_commands"):  # a group (typer's own click, not this click)
            ctx = type(cmd).context_class(cmd)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, [*path, name])

    return walk(typer.main.get_command(app), [])


VERBS = list(_verbs())


def _shown_default(param: click.Parameter) -> str | None:
    """The default a user must see whole: a plain value (flags and unset ones show none)."""
    if getattr(param, "param_type_name", "") != "option" or param.is_flag or param.hidden:
        return None
    default = param.default
    if default is None or default == "" or isinstance(default, bool) or callable(default):
        return None
    if isinstance(default, list | tuple):
        return ", ".join(str(getattr(d, "value", d)) for d in default) or None
    return str(getattr(default, "value", default))


def _commands_listed(text: str) -> list[str]:
    """The lines of a group's command list."""
    _, found, rest = text.partition("\nCommands:\n")
    return rest.split("\n\n")[0].splitlines() if found else []


@pytest.mark.parametrize(("path", "cmd"), VERBS, ids=[" ".join(p) or "stoker" for p, _ in VERBS])
def test_help__every_verb_at_80_columns_shows_an_example_and_cuts_nothing(
    path: list[str], cmd: click.Command
) -> None:
    res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})  # as a real process
    assert res.exit_code == 0, res.output
    text = res.output
    flat = " ".join(text.split())  # click wraps long help: a value may span two lines
    assert "…" not in text
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert not too_wide, too_wide
    example = text.find("Example")
    assert example >= 0, f"`stoker {' '.join(path)} --help` shows no example"
    assert f"stoker {' '.join(path)}".strip() in text[example:], text[example:]
    for param in cmd.params:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("-"):
                assert re.search(rf"(^|[\s,]){re.escape(name)}([\s,=]|$)", text, re.M), name
        default = _shown_default(param)
        if default is not None and param.name != "help":
            assert f"default: {default}" in flat, (param.name, default)
    for value in re.findall(r"\[default: ([^\]]*)\]", flat):
        assert "- " not in value, value  # a default broken at a hyphen by the wrapper
    cut = [line for line in _commands_listed(text) if line.rstrip().endswith("...")]
    assert not cut, cut  # a command's summary cut to fit the list
    usage = text.splitlines()[0]
    assert "{" not in usage and "<" not in usage, usage  # LOG, not {log}
    spelled = re.findall(r"(?m)^  [-\w][-\w, ]* (<[^>]*>)", text)
    assert not spelled, spelled  # --tenant TEXT, not --tenant <list[str]>


def test_help__the_cli_itself_without_a_terminal_at_80_columns_cuts_no_option() -> None:
    """The issue's example, through the real `stoker` process, stdout a pipe."""
    res = run_stoker("sim-backend", "--help", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert "--prefill-ms-per-token" in res.stdout and "…" not in res.stdout
    assert "[default: 0.2" in res.stdout and "stoker sim-backend --port 8000" in res.stdout


def test_help__values_are_named_as_a_person_writes_them() -> None:
    res = run_stoker("worker", "--help", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].endswith(" worker [OPTIONS] NAME")
    flat = " ".join(res.stdout.split())
    assert "NAME which worker to run (one of: traffic, deploy," in flat
    assert "--broker TEXT" in flat and "--redis-url URL" in flat  # a verb's own metavar kept
    warm = " ".join(run_stoker("warm", "--help", env={"COLUMNS": "80"}).stdout.split())
    assert (
        "--tenant TEXT" in warm and "--qps NUMBER" in warm and "--budget-requests INTEGER" in warm
    )
    missing = run_stoker("replay")
    assert missing.returncode == 2 and " replay [OPTIONS] LOG\n" in missing.stderr
    assert "Missing argument 'LOG'" in missing.stderr


def test_help__a_usage_error_is_one_line_naming_the_option() -> None:
    res = run_stoker("warm", "--qps", "0")
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--qps" in errors[0], res.stderr
    assert "╭" not in res.stderr  # no boxed panel
