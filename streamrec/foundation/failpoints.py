"""Failpoints: named places where a test can have a process killed (as etcd's gofail or
TiKV's fail-rs do), to prove that a crash at exactly that point loses nothing.

Off unless ``STREAMREC_FAILPOINTS`` is set, and then a dictionary lookup per hit.
Its value is a comma-separated list of ``NAME@RANK#N/RESTART``: the process of group
rank ``RANK`` (``*``: any; ``RANK`` env, 0 without) SIGKILLs itself the ``N``-th time
it reaches ``NAME``, in the launch whose ``TORCHELASTIC_RESTART_COUNT`` is
``RESTART`` (``/RESTART`` optional: any). Several entries may name one restart, so
one group run can die at many points in turn.
"""

from __future__ import annotations

import os
import signal

_ENV = "STREAMREC_FAILPOINTS"
_armed: dict[str, int] | None = None  # name -> the hit that kills; None until first use
_hits: dict[str, int] = {}


def _parse() -> dict[str, int]:
    spec = os.environ.get(_ENV, "")
    rank = os.environ.get("RANK", "0")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    out: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, rest = item.partition("@")
        who, _, rest = rest.partition("#")
        nth, _, when = rest.partition("/")
        if (who in ("", "*", rank)) and (when in ("", restart)):
            out[name] = int(nth or 1)
    return out


def hit(name: str) -> None:
    """Reach failpoint ``name``: nothing, unless a test armed it for this process and this hit."""
    global _armed
    if _armed is None:
        _armed = _parse() if _ENV in os.environ else {}
    if not _armed or name not in _armed:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == _armed[name]:
        os.write(2, f"failpoint {name} reached: SIGKILL\n".encode())  # unbuffered: the kill loses no line
        os.kill(os.getpid(), signal.SIGKILL)
