"""``streamrec config``: print the effective config as TOML, or the key reference as Markdown.

The reference is generated from the config dataclasses (each key's default and its trailing ``# comment``);
``streamrec config --reference --write docs/configuration.md`` rewrites the block between the reference
markers of that page, and ``tests/project/test_docs.py`` fails while the page differs from the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from pathlib import Path

from streamrec.app.config import Config
from streamrec.foundation.model_config import FieldSpec
from streamrec.ingest.ingest_config import GeneratedField


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("config", parents=[common], help="print the effective config (file + env + --set)")
    p.add_argument("--reference", action="store_true", help="print every key with its default and meaning (Markdown)")
    p.add_argument("--write", metavar="FILE", default=None,
                   help="with --reference: replace the reference block of FILE (docs/configuration.md), "
                        "not print it")
    p.set_defaults(func=cmd_config)


def cmd_config(args) -> int:
    if args.reference:
        if args.write:
            changed = write_reference(args.write)
            print(f"{args.write}: {'reference updated' if changed else 'reference already current'}")
        else:
            print(reference_markdown())
        return 0
    import tomli_w

    from streamrec.app.cli import config_from_args

    print(tomli_w.dumps(config_from_args(args).to_dict()), end="")
    return 0


def _comments(cls: type) -> dict[str, str]:
    """Trailing ``# comments`` on field lines: the meaning of each key, kept next to its default."""
    out = {}
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+): [^=]+=.*?#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def reference_markdown() -> str:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    defaults = Config()
    for section in dataclasses.fields(Config):
        obj = getattr(defaults, section.name)
        notes = _comments(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == "fields" and section.name == "model":
                shown = "4 fields: user, item, category, tags"
                note = "sparse fields (one embedding table each): list of {name, expected_ids, init_scale}"
            elif f.name == "fields":
                shown = "user, item, category, tags (tags: multi=3)"
                note = ("how `generate`/`produce --synthetic` draw each model field: list of {name, cardinality, zipf, "
                        "multi}; a model field without an entry gets the defaults below")
            elif dataclasses.is_dataclass(value):  # a nested table ([serving.guard]): one row per key
                inner = _comments(type(value))
                lines += [f"| `{section.name}.{f.name}.{g.name}` | `{getattr(value, g.name)!r}` | "
                          f"{inner.get(g.name, '').replace('|', '/')} |" for g in dataclasses.fields(value)]
                continue
            else:
                shown = f"`{value!r}`" if value != "" else '`""`'
                note = notes.get(f.name, "")
            lines.append(f"| `{section.name}.{f.name}` | {shown} | {note.replace('|', '/')} |")
            if f.name == "fields" and section.name == "model":
                ms = _comments(FieldSpec)
                lines += [f"| `model.fields[].{g.name}` | `{g.default!r}` | {ms.get(g.name, '')} |"
                          for g in dataclasses.fields(FieldSpec) if g.name != "name"]
    fs = _comments(GeneratedField)
    for f in dataclasses.fields(GeneratedField):
        if f.name != "name":
            lines.append(f"| `generator.fields[].{f.name}` | `{f.default!r}` | {fs.get(f.name, '')} |")
    return "\n".join(lines)


REFERENCE_START = "<!-- config-reference:start -->"
REFERENCE_END = "<!-- config-reference:end -->"


def reference_block(text: str) -> str | None:
    """The Markdown between the reference markers of ``text``, or None when it has no such block."""
    m = re.search(re.escape(REFERENCE_START) + r"\n(.*?)\n" + re.escape(REFERENCE_END), text, re.S)
    return m.group(1) if m else None


def write_reference(path: str | Path) -> bool:
    """Replace the reference block of the page at ``path`` with the current reference; True when it changed.

    The page must already hold both markers, so a wrong path is an error rather than a new file.
    """
    from streamrec.foundation import ConfigError

    path = Path(path)
    text = path.read_text()
    old = reference_block(text)
    if old is None:
        raise ConfigError(f"{path} has no block between {REFERENCE_START} and {REFERENCE_END}")
    new = reference_markdown()
    if old.strip() == new.strip():
        return False
    start = text.index(REFERENCE_START) + len(REFERENCE_START)
    end = text.index(REFERENCE_END, start)
    path.write_text(text[:start] + "\n" + new + "\n" + text[end:])
    return True
