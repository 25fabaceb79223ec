"""Slow scenarios of one test module run side by side, each test checking its own.

A kill matrix or a whole-pipeline run spends most of its wall time waiting (a process starting, a consumer
group settling after a member was killed, an idle exit), not computing, so a module's scenarios that share
nothing but the broker run at once in threads: the module costs about its longest scenario instead of their
sum. Each scenario is a function that asserts what it checks; the test named for it waits for it and fails
with its assertion and traceback. A module using this is marked ``xdist_group`` so that one worker runs its
tests, and the scenarios start once.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import pytest


class Scenarios:
    """Named scenarios started at once; ``result(name)`` waits for one and re-raises what it raised.

    Used as a context manager: leaving it waits for every scenario (each stops the processes it started in its
    own ``finally``), so none outlives the module's fixture."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(thread_name_prefix="scenario")
        self._runs: dict[str, Future] = {}

    def start(self, name: str, fn: Callable[..., Any], *args: Any, after: str | None = None) -> None:
        """Start ``fn(*args)`` as scenario ``name``; with ``after``, once that scenario has ended (however it
        ended), for a scenario whose timing the others' load would change."""
        first = self._runs.get(after) if after else None
        self._runs[name] = self._pool.submit(_after, first, fn, *args)

    def result(self, name: str, timeout: float | None = None) -> Any:
        return self._runs[name].result(timeout)

    def __enter__(self) -> "Scenarios":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True)


def _after(first: Future | None, fn: Callable[..., Any], *args: Any) -> Any:
    if first is not None:
        first.exception()  # waits; its outcome is its own test's
    return fn(*args)


def selected_scenarios(request: pytest.FixtureRequest, name_of: Callable[[pytest.Item], str]) -> set[str]:
    """The scenario names (``name_of(item)``) of the tests of the requesting module that this session runs, so
    that a run of some of them (``-k``, a node id) starts only theirs."""
    return {name_of(item) for item in request.session.items if item.module is request.module}
