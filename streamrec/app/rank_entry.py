"""A rank of a local trainer group as a function the elastic agent starts from a fork server.

``streamrec train --nproc N`` runs torch.distributed's elastic agent with :func:`rank_main` as its entry point
and ``forkserver`` as its start method. The fork server is one process the agent starts once per launch; it
imports the modules :func:`preload_modules` names (torch, the trainer group, serving's pusher, ``torch.export``
and what its first export of the snapshots' program needs) before it forks any rank, so a rank, and each rank
a restart after a rank's death starts, begins with them loaded instead of importing them itself. The fork
server is a fresh single-threaded interpreter, not a fork of the agent (whose rendezvous store and Kafka
clients run threads).

Each rank reads the agent's per-rank environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...) as a
``torchrun``-started process does. Its parent is the fork server, which lives as long as any of its ranks
does, not the agent: a rank therefore watches the agent itself (:func:`~streamrec.foundation.die_with`), so
that no rank trains on after its agent was killed, and the fork server exits once its ranks are gone.

  agent (streamrec train --nproc 2) ──starts──► fork server (imports preload_modules() once)
        │ rendezvous, restarts                       ├──fork──► rank 0: rank_main(*argv)
        └──────────── watches ───────────────────────└──fork──► rank 1: rank_main(*argv)
"""

from __future__ import annotations

import sys

# What every rank imports before it trains; a name that fails to import is skipped by the fork server (the
# rank then imports what it needs itself).
RANK_MODULES = ("torch.distributed", "torch.export", "streamrec.trainer.group", "streamrec.serving",
                "streamrec.app.commands.train")
# What ``torch.export`` imports on its first call (dynamo, its tracer and the program serialiser, which bring
# sympy and networkx along), a load of the size of ``import torch`` itself. Preloaded when rank 0 writes
# snapshots, so rank 0, and each rank 0 a restart forks, exports the snapshots' program without importing them.
EXPORT_MODULES = ("torch._dynamo", "torch._functorch.aot_autograd", "torch._export.serde.serialize")


def preload_modules(snapshots: bool) -> list[str]:
    """The modules the fork server imports before it forks a rank: :data:`RANK_MODULES`, and
    :data:`EXPORT_MODULES` when the group writes snapshots (``snapshots``)."""
    return list(RANK_MODULES) + (list(EXPORT_MODULES) if snapshots else [])


def rank_main(agent_pid: str, *argv: str) -> None:
    """``streamrec *argv`` in this rank, which dies with the agent ``agent_pid``. Returns on exit code 0 (the
    agent collects each rank's return value); any other code ends the process with it, which the agent takes
    for the rank's failure."""
    from streamrec.app.cli import main
    from streamrec.foundation import die_with

    die_with(int(agent_pid))
    code = main(list(argv))
    sys.stdout.flush()
    if code:
        sys.exit(code)


def release_ranks_on_close() -> None:
    """Make the elastic agent let its ranks go when it stops or restarts the group.

    A rank started as a function hands its return value to the agent and then waits until the agent has read
    every rank's (an event the agent sets). An agent that stops the group (SIGTERM, SIGINT) or restarts it
    (a rank died) closes the ranks without reading: it signals them and waits up to 30 s for them to exit,
    then kills them. A rank that drains on that signal and returns would wait out those 30 s. The agent's
    close here sets the event first, so a rank that returns afterwards exits at once. Where torch's
    ``MultiprocessContext`` has no such close or event, nothing changes (the ranks are killed after the
    wait, as before). Runs in the agent; idempotent."""
    from torch.distributed.elastic.multiprocessing import api

    context = getattr(api, "MultiprocessContext", None)
    close = getattr(context, "_close", None)
    if close is None or getattr(close, "releases_ranks", False):
        return

    def _close(self, *args, **kwargs):
        finished = getattr(self, "_worker_finished_event", None)
        if finished is not None:
            finished.set()
        return close(self, *args, **kwargs)

    _close.releases_ranks = True  # type: ignore[attr-defined]
    context._close = _close  # torch offers no hook on the close: its method is wrapped
