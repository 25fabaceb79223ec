"""``streamrec produce FILE.jsonl --topic T``: the lines of a generated delayed-feedback stream land on their
topic as they are, each keyed by its request_id (what the joiner's co-partitioning needs); a line without a key
stops the run naming the line, after the lines before it were sent."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from tests.joiner.test_join_worker import read_all

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]


def _streamrec(*args):
    return subprocess.run([sys.executable, "-m", "streamrec", *args], capture_output=True, text=True, timeout=120)


def test_lines_go_to_their_topic_keyed_by_request_id(bootstrap, tmp_path):
    from streamrec.ingest import TopicSpec, ensure_topics

    r = _streamrec("generate", "--delayed-feedback", "--events", "300", "--out", str(tmp_path / "stream"))
    assert r.returncode == 0, r.stderr
    topic = f"imps-{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [TopicSpec(topic, 3)])
    src = tmp_path / "stream" / "impressions.jsonl"
    r = _streamrec("produce", str(src), "--topic", topic, "--bootstrap", bootstrap, "-q")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in src.read_text().splitlines()]
    got = read_all(bootstrap, topic)
    assert len(got) == len(lines) == 300
    assert all(m.key == json.loads(m.value)["request_id"].encode() for m in got)
    assert sorted(json.loads(m.value)["request_id"] for m in got) == sorted(x["request_id"] for x in lines)
    assert len({m.partition for m in got}) > 1  # keyed: spread over the partitions by request_id

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": "a", "ts": 1}\n{"ts": 2}\n{"request_id": "c"}\n')
    other = f"bad-{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [TopicSpec(other, 1)])
    r = _streamrec("produce", str(bad), "--topic", other, "--bootstrap", bootstrap, "-q")
    assert r.returncode == 2 and "line 2" in r.stderr and "request_id" in r.stderr and "Traceback" not in r.stderr
    assert [m.key for m in read_all(bootstrap, other)] == [b"a"]
