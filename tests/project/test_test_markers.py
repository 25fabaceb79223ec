"""The suite's own rules (tests/conftest.py): a test that starts a child process without the ``subprocess``
marker fails, so ``-m "not e2e and not subprocess"`` runs in one process; a marked test may start one; and
the property tests' example counts follow the hypothesis profile."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest
from hypothesis import settings

from tests.conftest import _CHILDREN_STARTED, FULL_EXAMPLES, fuzz_examples


def test_an_unmarked_test_cannot_start_a_child(request):
    with pytest.raises(AssertionError, match="not marked subprocess"):
        subprocess.run([sys.executable, "-c", "pass"])
    with pytest.raises(AssertionError, match="not marked subprocess"):
        multiprocessing.get_context("spawn").Process(target=print).start()
    with pytest.raises(AssertionError, match="not marked subprocess"):
        os.system("true")
    started = request.node.stash[_CHILDREN_STARTED]
    assert len(started) == 3, started
    started.clear()  # refused as this test expects: the test itself passes


@pytest.mark.subprocess
def test_a_marked_test_may_start_one():
    assert subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True,
                          check=True).stdout.strip() == "42"


def test_example_counts_follow_the_profile(monkeypatch):
    monkeypatch.delenv("STREAMREC_FUZZ_EXAMPLES", raising=False)
    active = settings.default.max_examples
    assert fuzz_examples(300) == max(5, 300 * active // FULL_EXAMPLES)
    assert settings.get_profile("ci").max_examples == FULL_EXAMPLES
    assert settings.get_profile("dev").max_examples == FULL_EXAMPLES // 10
    monkeypatch.setenv("STREAMREC_FUZZ_EXAMPLES", "7")
    assert fuzz_examples(300) == 7
