"""The entry point of a local group's ranks (``streamrec/app/rank_entry.py``): the modules its fork server
imports before forking the ranks exist (the fork server skips a name that fails to import, which would leave
every rank importing them itself, silently), a rank's exit code reaches the agent as the process's, and the
agent's close lets go of ranks that wait to hand over their result."""

from __future__ import annotations

import importlib
import os

import pytest

from streamrec.app.rank_entry import EXPORT_MODULES, RANK_MODULES, preload_modules, rank_main, release_ranks_on_close


@pytest.mark.parametrize("name", RANK_MODULES + EXPORT_MODULES)
def test_every_module_the_fork_server_imports_exists(name):
    assert importlib.import_module(name).__name__ == name


def test_the_export_modules_are_preloaded_only_for_a_group_that_writes_snapshots():
    assert preload_modules(False) == list(RANK_MODULES)
    assert preload_modules(True) == list(RANK_MODULES + EXPORT_MODULES)


def test_a_failing_command_ends_the_rank_with_its_code_and_success_returns(capsys):
    with pytest.raises(SystemExit) as e:  # a config error in the rank: exit code 2, as the command line's
        rank_main(str(os.getpid()), "train", "--set", "trainer.batch_size=0")
    assert e.value.code == 2 and "batch_size" in capsys.readouterr().err
    assert rank_main(str(os.getpid()), "config", "--set", "trainer.batch_size=64") is None


def test_the_agents_close_sets_the_event_its_ranks_wait_on_first_and_is_wrapped_once():
    from torch.distributed.elastic.multiprocessing import api

    release_ranks_on_close()
    wrapped = api.MultiprocessContext._close
    release_ranks_on_close()
    assert api.MultiprocessContext._close is wrapped and wrapped.releases_ranks

    class Event:
        is_set = False

        def set(self):
            self.is_set = True

    closing = api.MultiprocessContext.__new__(api.MultiprocessContext)
    closing._worker_finished_event, closing._pc = Event(), None  # no process left: torch's close returns
    closing._close(None)
    assert closing._worker_finished_event.is_set
