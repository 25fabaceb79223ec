"""The README is the user's manual: its config reference and commands must match the code."""

import re
from pathlib import Path

from streamrec.app.commands.config import reference_markdown

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_config_reference_is_current():
    m = re.search(r"<!-- config-reference:start -->\n(.*?)\n<!-- config-reference:end -->", README, re.S)
    assert m, "README lost its config reference block"
    assert m.group(1).strip() == reference_markdown().strip(), (
        "README config reference is stale: regenerate it with `streamrec config --reference`"
    )


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert commands[0].strip() == "./scripts/setup.sh && .venv/bin/streamrec demo"
    test_cmd = commands[1].strip()
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_every_cli_command_is_in_the_tour():
    from streamrec.app.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    missing = [name for name in sub.choices if f"`streamrec {name}" not in README]
    assert not missing, f"README's CLI tour misses: {missing}"
