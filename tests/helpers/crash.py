"""A stand-in for a native crash on one record, for the crash-loop tests.

:func:`install_crash_hook` writes a ``sitecustomize`` module; with its folder on
``PYTHONPATH`` every Python process (a trainer, a sketch worker, the probe child a
trainer spawns) segfaults when a JSON parser the codec uses (``orjson.loads``,
``pyarrow.json.read_json`` of a batch, ``json.loads``) meets the bytes ``crash-me``, as a
native decoder bug would.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

CRASH_MARK = "crash-me"

_SITECUSTOMIZE = textwrap.dedent('''
    import json, os, signal
    import orjson
    import pyarrow.json

    def _crashing(parse):
        def loads(s, *a, **k):
            try:
                hit = ("crash-me" in s) if isinstance(s, str) else (b"crash-me" in bytes(s))
            except TypeError:  # a file object, say: not a record
                hit = False
            if hit:
                os.kill(os.getpid(), signal.SIGSEGV)
            return parse(s, *a, **k)
        return loads

    json.loads = _crashing(json.loads)
    orjson.loads = _crashing(orjson.loads)
    pyarrow.json.read_json = _crashing(pyarrow.json.read_json)  # the columnar path (ingest/json_columns.py)
''')


def install_crash_hook(folder: Path) -> dict:
    """Write the hook into ``folder``; returns an environment that loads it in child processes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return dict(os.environ, PYTHONPATH=str(folder))
