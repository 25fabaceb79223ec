"""Waiting on a condition instead of sleeping a fixed time: a test proceeds as soon as what it
needs is true, and fails saying what it waited for when it never becomes true; and an instant that
splits a test's writes into before and after, for logic that compares stored times with a clock."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value, and return that value.

    Raises AssertionError naming ``what`` (and the last falsy value) if ``timeout`` seconds pass first;
    the predicate is always called at least once, and its last call is at or after the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def instant_between() -> float:
    """A ``time.time()`` instant that separates the calls around it: every ``time.time()`` read before this call
    returns is at or before the instant, and every one read after it is later (it spins until the clock moves)."""
    t = time.time()
    while time.time() <= t:
        pass
    return t
