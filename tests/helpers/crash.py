"""A stand-in for a native crash on one record, for the crash-loop tests.

:func:`install_crash_hook` writes a ``sitecustomize`` module; with its folder on
``PYTHONPATH`` every Python process (a trainer, a sketch worker, the probe child a
trainer spawns) segfaults when ``json.loads`` meets the bytes ``crash-me``, as a
native decoder bug would.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

CRASH_MARK = "crash-me"

_SITECUSTOMIZE = textwrap.dedent('''
    import json, os, signal
    _loads = json.loads
    def loads(s, *a, **k):
        if (b"crash-me" if isinstance(s, (bytes, bytearray)) else "crash-me") in s:
            os.kill(os.getpid(), signal.SIGSEGV)
        return _loads(s, *a, **k)
    json.loads = loads
''')


def install_crash_hook(folder: Path) -> dict:
    """Write the hook into ``folder``; returns an environment that loads it in child processes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return dict(os.environ, PYTHONPATH=str(folder))
