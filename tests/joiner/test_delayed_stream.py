"""The delayed-feedback generator: heavy-tailed delays (some after the window, some never), drift, the truth
file, and the joiner's window mode against that truth: a positive only for truly clicked impressions."""

from __future__ import annotations

import json

import numpy as np

from streamrec.app.config import load_config
from streamrec.joiner import Action, DelayedStream, JoinRules, JoinState


def test_delays_are_heavy_tailed_and_the_truth_is_written(tmp_path):
    cfg = load_config(None, {"generator.events_per_s": 10.0}, env={})
    s = DelayedStream(cfg.model, cfg.generator, seed=3)
    imps, acts, truth = s.generate(3000)
    ts = {e["request_id"]: e["ts"] for e in imps}
    clicks = [a for a in acts if a["type"] == "click"]
    delays = np.array([(a["ts"] - ts[a["request_id"]]) / 1000.0 for a in clicks])
    assert len(clicks) == sum(truth.values()) and 0 < len(clicks) < len(imps)  # some never clicked
    assert np.median(delays) < 300 and np.quantile(delays, 0.99) > 10 * np.median(delays)  # heavy tail
    assert (delays > 3600).any()  # some after a one-hour window
    assert all(a["ts"] <= b["ts"] for a, b in zip(acts, acts[1:]))
    paths = s.write(200, tmp_path)
    rows = [json.loads(x) for x in paths["truth"].read_text().splitlines()]
    assert len(rows) == 200 and {r["label"] for r in rows} <= {0, 1}
    again = DelayedStream(cfg.model, cfg.generator, seed=3)
    assert s.generate(50)[0] == again.generate(50)[0]  # deterministic in the seed


def test_window_join_of_the_stream_never_labels_an_unclicked_impression_positive():
    cfg = load_config(None, {"generator.events_per_s": 10.0, "join.window_s": 600.0}, env={})
    imps, acts, truth = DelayedStream(cfg.model, cfg.generator, seed=5).generate(2000)
    m = JoinState(JoinRules.from_config(cfg.join))
    out = []
    i = j = 0
    while i < len(imps) or j < len(acts):  # by event time, as a live stream arrives
        if j >= len(acts) or (i < len(imps) and imps[i]["ts"] <= acts[j]["ts"]):
            e = imps[i]
            out += m.impression(e["request_id"], e["ts"], e)
            i += 1
        else:
            a = acts[j]
            out += m.action(Action(a["request_id"], a["ts"], a["type"]))
            j += 1
    labels = {ex.request_id: ex.event["label"] for ex in out}
    assert len(labels) == len(out)  # one example per impression
    assert all(truth[r] == 1 for r, y in labels.items() if y == 1)
    missed = sum(1 for r, y in labels.items() if y == 0 and truth[r] == 1)
    assert missed > 0  # clicks after the 10-minute window: the cost of waiting only so long


def test_generate_delayed_feedback_command(tmp_path):
    from streamrec.app.cli import main

    out = tmp_path / "delayed"
    assert main(["generate", "--delayed-feedback", "--events", "300", "--seed", "4", "--out", str(out)]) == 0
    imps = [json.loads(x) for x in (out / "impressions.jsonl").read_text().splitlines()]
    truth = [json.loads(x) for x in (out / "truth.jsonl").read_text().splitlines()]
    acts = [json.loads(x) for x in (out / "actions.jsonl").read_text().splitlines()]
    assert len(imps) == len(truth) == 300 and all("label" not in e for e in imps)
    assert {a["request_id"] for a in acts if a["type"] == "click"} == {t["request_id"] for t in truth if t["label"]}
