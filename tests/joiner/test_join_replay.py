"""A replay labels as the live run did: the joiner running while impressions and actions arrive in chunks
(their interleaving set by arrival), then a fresh joiner (its own group and state, another output topic)
reading both topics from the start, write the same examples, the oracle's. The join reads event time,
never wall time or how the two topics happened to interleave."""

from __future__ import annotations

import copy
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from streamrec.ingest import TopicSpec, ensure_topics
from tests.helpers.waiting import wait_until
from tests.joiner.test_join_worker import P, STREAMREC, examples, join_config, joined_streams, produce
from tests.sketch.test_sketch_worker import stop, write_config

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]


def _start(cfg, bootstrap, tmp_path, name: str) -> tuple[subprocess.Popen, Path]:
    """A joiner process for ``cfg`` (its config written to a file of its own, its log ``<name>.log``)."""
    config = write_config(cfg, tmp_path / f"{name}.toml")
    log = tmp_path / f"{name}.log"
    proc = subprocess.Popen([STREAMREC, "join", "--config", str(config), "--bootstrap", bootstrap],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    return proc, log


def _examples_once_complete(cfg, bootstrap, proc, log, name: str, want_total: int, r):
    """The examples of ``cfg``'s output once ``want_total`` have arrived and nothing more came for 1 s."""
    wait_until(lambda: sum(examples(bootstrap, cfg, r).values()) >= want_total or proc.poll() is not None,
               120, f"the {name} joiner's examples", interval=1.0)
    assert proc.poll() is None, log.read_text()[-3000:]
    time.sleep(1.0)  # nothing more comes: a doubled example would show now
    return examples(bootstrap, cfg, r)


@pytest.mark.parametrize("mode", ["fake_negative"])  # its examples depend on the most: both kinds, both topics
def test_a_replay_from_the_start_writes_what_the_live_run_wrote(topics, bootstrap, tmp_path, mode):
    cfg = join_config(topics, mode)
    cfg.join.state_dir = str(tmp_path / "live")
    r, imps, acts, want = joined_streams(bootstrap, cfg, 23, n=300)

    def chunk(records: dict, k: int, n: int = 5) -> dict:
        return {p: v[k * len(v) // n:(k + 1) * len(v) // n] for p, v in records.items()}

    def feed_live():  # while it runs: two chunks of actions ahead of any impression, then chunk after chunk
        none = {p: [] for p in range(P)}
        produce(bootstrap, cfg, none, chunk(acts, 0))
        produce(bootstrap, cfg, none, chunk(acts, 1))
        for k in range(5):
            time.sleep(0.3)
            produce(bootstrap, cfg, chunk(imps, k), chunk(acts, k + 2) if k + 2 < 5 else none)

    live_proc, live_log = _start(cfg, bootstrap, tmp_path, "live")
    replay_proc = None
    try:
        feed_live()
        # every record is in both topics now: the replay starts (from the start of both) while the live run finishes
        replay_cfg = copy.deepcopy(cfg)
        s = uuid.uuid4().hex[:8]
        replay_cfg.join.group, replay_cfg.join.state_dir = f"replay-{s}", str(tmp_path / "replay")
        replay_cfg.kafka.events_topic = f"events-replay-{s}"
        ensure_topics(bootstrap, [TopicSpec(replay_cfg.kafka.events_topic, P)])
        replay_proc, replay_log = _start(replay_cfg, bootstrap, tmp_path, "replay")
        live = _examples_once_complete(cfg, bootstrap, live_proc, live_log, "live", sum(want.values()), r)
        assert live == want
        replay = _examples_once_complete(replay_cfg, bootstrap, replay_proc, replay_log, "replay",
                                         sum(want.values()), r)
        assert replay == live
    finally:
        stop(live_proc)
        if replay_proc is not None:
            stop(replay_proc)
