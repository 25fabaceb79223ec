"""The README and docs/ are the user's manual: their config reference, commands and links must match the code.

Every ``streamrec`` command shown in a ``bash`` block of README.md or docs/*.md is parsed by the CLI's own
parser, so a renamed subcommand or option breaks this test; the README's by-hand block is also run end to end
(tests/e2e/test_readme_by_hand.py).
"""

import contextlib
import dataclasses
import io
import re
import shlex
from pathlib import Path

import pytest

from streamrec.app.commands.config import reference_block, reference_markdown
from streamrec.app.config import Config

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "BENCHMARKS.md", *DOCS]


def test_config_reference_is_current():
    block = reference_block((ROOT / "docs" / "configuration.md").read_text())
    assert block is not None, "docs/configuration.md lost its config reference block"
    assert block.strip() == reference_markdown().strip(), (
        "docs/configuration.md is stale: regenerate it with "
        "`streamrec config --reference --write docs/configuration.md`"
    )


def test_write_reference_replaces_only_the_block(tmp_path):
    from streamrec.app.commands.config import REFERENCE_END, REFERENCE_START, write_reference

    page = tmp_path / "configuration.md"
    page.write_text(f"# intro\n\n{REFERENCE_START}\n| stale |\n{REFERENCE_END}\n\ntail\n")
    assert write_reference(page) is True
    text = page.read_text()
    assert text.startswith("# intro\n\n") and text.endswith("\n\ntail\n") and "| stale |" not in text
    assert reference_block(text).strip() == reference_markdown().strip()
    assert write_reference(page) is False


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert commands[0].strip() == "./scripts/setup.sh && .venv/bin/streamrec demo"
    test_cmd = commands[1].strip()
    assert test_cmd == "./scripts/setup.sh && .venv/bin/python -m pytest -q -n 4"
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_readme_is_a_front_door():
    assert len(README.splitlines()) <= 300, "README.md grew past 300 lines: move the detail into docs/"
    assert "<!-- by-hand:start -->" in README and "<!-- by-hand:end -->" in README
    for page in ("producing-events", "serving", "deployment", "scaling-out", "operations", "configuration",
                 "known-limits", "README"):
        assert f"(docs/{page}.md)" in README, f"README does not link docs/{page}.md"


def test_every_cli_command_is_in_the_tour():
    from streamrec.app.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for page in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        text = page.read_text()
        missing = [name for name in sub.choices if f"`streamrec {name}" not in text]
        assert not missing, f"{page.relative_to(ROOT)}'s CLI table misses: {missing}"


def shown_commands(text: str) -> list[list[str]]:
    """The argv after ``streamrec`` of every command line in the ``bash`` blocks of a page.

    Continuation lines are joined, ``&&`` chains split, a trailing ``&``, ``# comments`` and leading ``VAR=value``
    environment assignments dropped; a line runs
    streamrec when it starts with ``streamrec`` / ``.venv/bin/streamrec`` or holds ``-m streamrec`` (torchrun).
    """
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                part = part.strip().rstrip("&").strip()
                if not part or part.startswith("#"):
                    continue
                argv = shlex.split(part, comments=True)
                while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):  # VAR=value prefixes
                    argv = argv[1:]
                if argv and argv[0] in ("streamrec", ".venv/bin/streamrec"):
                    out.append(argv[1:])
                elif "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == ["streamrec"]:
                    out.append(argv[argv.index("-m") + 2:])
    return out


def parse_error(argv: list[str]) -> str | None:
    """What the CLI's parser says about ``streamrec ARGV``, or None when it accepts it."""
    from streamrec.app.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "exit"
    defaults = Config()
    for item in getattr(args, "overrides", None) or []:
        key = item.split("=", 1)[0]
        section, _, name = key.partition(".")
        part = getattr(defaults, section, None)
        if not dataclasses.is_dataclass(part) or not hasattr(part, name):
            return f"--set {key}: no such config key"
    return None


def test_the_command_check_refuses_an_unknown_option():
    assert parse_error(["train", "--bootstrap", "127.0.0.1:9092"]) is None
    assert parse_error(["train", "--no-such-option"]) is not None
    assert parse_error(["no-such-command"]) is not None
    assert parse_error(["serve", "--set", "serving.push_token=x"]) is None
    assert parse_error(["serve", "--set", "serving.no_such_key=x"]) is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_streamrec_command_shown_parses(page):
    commands = shown_commands(page.read_text())
    bad = {shlex.join(argv): err for argv in commands if (err := parse_error(argv)) is not None}
    assert not bad, f"{page.relative_to(ROOT)} shows commands the CLI refuses: {bad}"


def test_the_pages_show_the_commands_a_reader_runs():
    names = {argv[0] for page in PAGES for argv in shown_commands(page.read_text()) if argv}
    assert {"demo", "broker", "serve", "sketch", "train", "produce", "generate", "predict", "report"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    text = page.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    broken = [t for t in targets if "://" not in t and not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


def dashboard_rows() -> list[list[str]]:
    """The cells of each row of BENCHMARKS.md's dashboard table (the first table after "## Dashboard")."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    section = text.split("## Dashboard", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    assert lines[0].replace(" ", "") == "|bench|goal|now|status|command|machine|date|", lines[0]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in lines[2:]]


def test_benchmarks_dashboard_fits_one_screen_and_its_commands_parse():
    rows = dashboard_rows()
    assert 10 <= len(rows) <= 40, f"{len(rows)} dashboard rows: one row per goal, one screen"
    for bench, goal, now, status, command, machine, date in rows:
        assert status in {"PASS", "FAIL", "blocked", "stated"}, (goal, status)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), (goal, date)
        assert max(len(goal), len(now)) <= 60, f"dashboard cells stay short: {goal!r} / {now!r}"
        m = re.fullmatch(r"`(streamrec bench .+)`", command)
        assert m, (goal, command)
        assert parse_error(shlex.split(m.group(1))[1:]) is None, command
    assert parse_error(["bench", "no-such-bench"]) is not None
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert "## GPU (nvidia H200/H100)" in text and "## Methods" in text


def test_the_ports_the_shown_commands_fix_lie_below_the_ephemeral_range():
    """The README's commands run verbatim in the suite (and on a user's machine beside other programs): a fixed
    port inside Linux's ephemeral range (32768-60999) can be taken at any moment by a client's own port or
    a test's free port."""
    fixed = {int(p) for text in (README, (ROOT / "docs" / "joining.md").read_text())
             for p in re.findall(r"(?:--port |127\.0\.0\.1:)(\d+)", text)}
    assert fixed and all(p < 32768 for p in fixed), sorted(fixed)
