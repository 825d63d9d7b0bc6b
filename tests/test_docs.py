"""The documentation is generated from the code and stays true to it: every config key and every
CLI flag has its line in docs/configuration.md and docs/cli.md, those files are current, and every
command the README shows parses (or, for a script, exists)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from gpufleet import cli as shell

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpufleet_docs_build", ROOT / "docs" / "build.py")
docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs)


def test_generated_references_are_current():
    assert docs.main(["--check"]) == 0, "run python docs/build.py"


def test_every_config_key_has_its_line():
    text = docs.CONFIGURATION.read_text()
    sections = dict(re.findall(r"^## \[([\w.]+)\]\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    for table, options in docs.schema().items():
        for o in options:
            if o.expected != docs.SUBTABLE:
                assert re.search(rf"^\| `{o.key}` \| \w+ \| .+ \| .+ \| \S.* \|$", sections[table], re.M), f"[{table}] {o.key}"


def test_a_key_without_its_meaning_or_a_meaning_without_its_key_is_an_error():
    meanings = tomllib.loads(docs.MEANINGS.read_text())
    del meanings["collector"]["scrape"]["timeout"]
    with pytest.raises(docs.DocsError, match=r"\[collector.scrape\] timeout"):
        docs.configuration(meanings)
    meanings = tomllib.loads(docs.MEANINGS.read_text())
    meanings["policy"]["enforse"] = "a typo"
    with pytest.raises(docs.DocsError, match=r"\[policy\] enforse"):
        docs.configuration(meanings)


def test_every_config_section_of_the_code_is_documented():
    from gpufleet.config import SECTIONS

    assert set(SECTIONS) <= set(docs.schema())


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    found = [("gpufleet", shell.parser())]

    def walk(p: argparse.ArgumentParser, where: str) -> None:
        found.append((where, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, child in a.choices.items():
                    walk(child, f"{where} {name}")

    for name in shell.SUBCOMMANDS:
        sub = next(a for a in shell.parser(name)._actions if isinstance(a, argparse._SubParsersAction))
        walk(sub.choices[name], f"gpufleet {name}")
    return found


def test_every_cli_flag_has_its_line():
    text = docs.CLI.read_text()
    blocks = dict(re.findall(r"^##+ `(gpufleet[\w -]*)`\n(.*?)(?=^##|\Z)", text, re.M | re.S))
    for where, p in _parsers():
        for a in p._actions:
            if a.option_strings and not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS:  # (a retired flag, refused)
                flag = a.option_strings[-1]
                assert re.search(rf"^- `[^`]*{re.escape(flag)}\b[^`]*`: \S", blocks[where], re.M), f"{where} {flag}"


def test_a_flag_without_help_is_an_error():
    p = argparse.ArgumentParser()
    action = p.add_argument("--undocumented")
    with pytest.raises(docs.DocsError, match="--undocumented"):
        docs._flag_line(action, "gpufleet x")


def readme_commands() -> list[str]:
    """The command lines of the README's shell blocks (comments and prompts stripped)."""
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"^```(?:bash|sh|console|shell)\n(.*?)^```", text, re.M | re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip().removeprefix("$ ")
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def test_the_readmes_commands_run():
    commands = readme_commands()
    assert any(c.startswith("gpufleet ") for c in commands) and any(c.startswith("./scripts/") for c in commands)
    for command in commands:
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", command):
            argv = shlex.split(part)
            if not argv or "=" in argv[0]:
                continue
            if argv[0] == "gpufleet":
                if set(argv) & {"--version", "-h", "--help"}:
                    continue
                try:
                    args = shell.parse_args(argv[1:])
                except SystemExit as e:
                    pytest.fail(f"README: `{part}` does not parse (exit {e.code})")
                assert args.command, part
            elif argv[0].startswith("./") or (argv[0].startswith("python") and len(argv) > 1 and argv[1].endswith(".py")):
                script = ROOT / (argv[0] if argv[0].startswith("./") else argv[1])
                assert script.is_file(), f"README: `{part}` names {script}, which does not exist"
                if argv[0].startswith("./"):
                    assert script.stat().st_mode & 0o111, f"README: {script} is not executable"
