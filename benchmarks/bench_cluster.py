"""``streamrec bench cluster``: a trainer group across simulated hosts, over shaped links, and a host lost.

The hosts are Linux network namespaces on one machine (``benchmarks/netns.py``: one bridge, a veth link per
host, shaped each way with a token bucket). Host 0 runs the broker (``EmbeddedBroker`` on its own address);
the trainer ranks run on hosts 1..N, one per host, each started as a user starts one on a machine of its own:
``torchrun --nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST1:29400 -m streamrec train``
(``--rdzv-conf is_host=...`` and ``--local-addr`` name the host's address, since the namespaces share the
machine's hostname). The same synthetic events (the default model) are produced once; every run trains them
from the start with its own consumer group, store, checkpoints and metrics log.

1. ``loopback``: the N ranks in ONE host (``streamrec train --nproc N``, gloo over that host's loopback): the
   reference. ``auc_cluster_minus_loopback`` = the N-host run's progressive AUC minus this one's;
   ``offsets_committed``: the unshaped N-host run committed every partition's offset past its last record,
   and its final checkpoint holds the same offsets.
2. Bandwidth: the N-host group with every link at each of ``mbits`` (0 = unshaped), and a ``WIDE``-rank group
   at its own list (``links_4``). Per run: events/s over the span the metrics log shows training, the group's
   collective bytes per event and their split (``row_bytes_per_event``: the row exchange;
   ``dense_bytes_per_event``: the dense all-reduce; from its metrics log), and the Kafka bytes per event (the
   events' Arrow encoding), and the group's metrics traffic (``metrics_bytes_per_s``: a histogram all-reduce
   and the sliding window's all-gather per metrics record, every ``trainer.log_every_s``). The model: each
   rank sends and receives its share of the collective traffic per event it trains and also receives its
   events from the broker, and the metrics take their share of every link first, so links of L bytes/s cap
   the group at ``(N x L - metrics bytes/s) / (collective + kafka bytes per event)``;
   ``predicted_events_per_s`` is the smaller of that cap and the unshaped run's rate, and
   ``predicted_vs_measured`` = predicted / measured at each bandwidth where the cap is the smaller (the link
   is the bottleneck; keys ``"20"`` for N ranks, ``"4x10"`` for the wider group).
3. Relief (``reliefs``): at the most link-bound bandwidth, each of ``RELIEFS`` (the bf16 wire for rows and
   the dense sum, PowerSGD, per-rank batches): ``speedup`` over the exact group there, ``predicted_speedup``
   from the run's own bytes, ``auc_cost`` (the exact group's AUC minus this one's).
4. Stale sparse reads (``sparse_staleness``): what PERSIA's asynchronous sparse part could give at that
   bandwidth. Overlapping communication with compute cannot beat a link that is the bottleneck, so only
   fewer bytes can: ``benchmarks/staleness.py`` replays the group's steps with a K-step cache of fetched rows
   per rank (``STALENESS_KS``) and gives the share of the row exchange's bytes each K saves; with the dense
   all-reduce and Kafka bytes unchanged that bounds events/s at ``speedup_bound`` (the best K), and
   ``speedup_bound_every_row_cached`` is the bound with no row sent at all. ``trainer.sparse_staleness`` is
   built only where the bound reaches the goal.
5. Host loss (``--quick`` and full): the N-host group elastic (``--nnodes 1:N``), ``trainer.group_timeout_s``
   = ``GROUP_TIMEOUT_S``, checkpoints every ``CHECKPOINT_EVERY_S``, links at ``LOSS_MBIT``, serving on host 0
   (pushed to every second) with a prober calling Predict every 50 ms; at ``LOSS_PHASES`` of the first
   checkpoint interval after training began, the last trainer host is lost: ``kill`` (SIGKILL to every process
   it runs) or ``cut`` (its link down: no reset reaches the others; healed after the run). Per run
   (``host_loss_<how>_<percent>``): ``predict_failed`` (calls that failed after the first answer),
   ``predict_max_gap_s``, ``served_versions`` (first and last version answered), ``detect_s`` = from the loss
   to the surviving ranks' restart as a smaller group (its first log line), ``recover_s`` = to training again
   (the metrics log's first record after that restart with events past where they stopped), ``events_lost`` = the events of the records the
   group's final checkpoint has not consumed (0: every partition's offset at its end),
   ``events_duplicated`` = events trained minus events produced, against the run's ``duplicates_bound`` (one
   checkpoint interval at its own rate before the loss, and the window in hand).
   ``host_loss_detect_s`` / ``host_loss_recover_s`` are the worst of these runs, ``events_lost`` the sum over
   every loss run. Then the services host (``services_kill``, ``services_cut``: a serving replica and the
   sketch worker lost mid-run and back 5 s later; ``benchmarks/cluster_services.py``).

Goals (``goals``): ``predicted_vs_measured`` within 0.8-1.25 at every link-bound bandwidth,
``sparse_staleness`` >= 1.5x, ``host_loss_detect_s <= 30``, ``events_lost == 0``. Needs root and iproute2 (``netns.available()``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = {  # events, link Mbit/s (0 = unshaped), ranks, host loss, links of the wider group (WIDE ranks)
    "tiny": (6_000, (0,), 2, False, ()),
    "quick": (150_000, (0, 1000, 100, 20), 2, True, (0, 10)),
    "full": (400_000, (0, 1000, 100, 50, 20, 10), 2, True, (0, 20, 10)),
}
WIDE = 4  # ranks of the wider group
RELIEFS = {  # the settings that relieve a link, each tried at the most link-bound bandwidth
    "bf16_wire": {"trainer.exchange_precision": "bf16", "trainer.dense_allreduce_precision": "bf16"},
    "powersgd": {"trainer.dense_allreduce_compression": "powersgd", "trainer.powersgd_start_iter": 10},
    "rank_batches": {"trainer.group_batch": "rank"},
}
SERVICES_MBIT = 10  # the links of the services-host runs: slow enough that the loss and return fall mid-run
PARTITIONS = 4
RDZV_PORT = 29400
GROUP_TIMEOUT_S = 15.0  # trainer.group_timeout_s of the host-loss runs: how long a cut link goes unnoticed
CHECKPOINT_EVERY_S = 2.0  # trainer.checkpoint_every_s of the host-loss runs: what a restart trains again
LOSS_PHASES = (0.1, 0.5, 0.9)  # where in a checkpoint interval the host is lost
LOSS_MBIT = 20  # the links of the host-loss runs: the group trains long enough for a loss late in an interval
TS = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3})")


def _streamrec() -> list[str]:
    return [sys.executable, "-m", "streamrec"]


def _records(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _log_times(path: Path, needle: str) -> list[float]:
    """Epoch seconds of the log lines of ``path`` holding ``needle`` (python logging's timestamp)."""
    import datetime

    out = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        m = TS.match(line)
        if m and needle in line:
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1e3
            out.append(t)
    return out


class GroupNotFormed(RuntimeError):
    """A host-loss run whose trainer group never formed: host 1's torchrun gave up waiting in the rendezvous
    store (torch elastic's restart to take in a host that joined after the first round can leave both agents
    waiting for each other's keys). It says nothing of the host loss the run measures."""


class ClusterBench:
    def __init__(self, root: Path, ranks: int, events: int, trainer_hosts: int | None = None,
                 last_call_s: float = 2.0):
        """``last_call_s``: torchrun's ``last_call_timeout``, how long a round that has its minimum of hosts waits
        for more; hosts whose start-ups lie further apart form the first round without the late ones."""
        from .netns import SimulatedCluster

        self.root, self.ranks, self.events, self.last_call_s = root, ranks, events, last_call_s
        # host 0: the broker; 1..trainer_hosts: trainer ranks; the last: the services host (cluster_services)
        self.cluster = SimulatedCluster(max(ranks, trainer_hosts or 0) + 2, root / "hosts")
        h0 = self.cluster.hosts[0]
        self.bootstrap = f"{h0.address}:9092"
        code = ("from streamrec.ingest import EmbeddedBroker; import time; "
                f"EmbeddedBroker(port=9092, host='{h0.address}').start(); print('broker up', flush=True); "
                "time.sleep(10**6)")
        self.cluster.spawn(0, [sys.executable, "-c", code], "broker")
        deadline = time.monotonic() + 60
        while "broker up" not in (root / "hosts" / "h0-broker.log").read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise RuntimeError("the broker did not start on host 0: " + str(root / "hosts" / "h0-broker.log"))
            time.sleep(0.2)
        cfg = self._config("produce")
        p = self.cluster.spawn(0, [*_streamrec(), "produce", "--synthetic", str(events), "--config", str(cfg),
                                   "--bootstrap", self.bootstrap, "--quiet"], "produce")
        if p.wait(300) != 0:
            raise RuntimeError("producing the events failed: " + str(root / "hosts" / "h0-produce.log"))
        self.kafka_bytes_per_event = self._kafka_bytes()
        from streamrec.app.config import load_config

        self.events_per_message = load_config(str(cfg), env={}).kafka.events_per_message
        self.messages = -(-events // self.events_per_message)  # the producer's records (one Arrow message each)

    def _config(self, name: str, **over) -> Path:
        import tomli_w

        from streamrec.app.config import load_config

        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        cfg = load_config(None, {
            "kafka.events_topic": "events", "kafka.partitions": PARTITIONS, "kafka.trainer_group": f"trainer-{name}",
            "trainer.device": "cpu", "trainer.idle_exit_s": 6.0, "trainer.checkpoint_every_s": 5.0,
            "trainer.log_every_s": 0.5, "trainer.log_path": str(d / "metrics.jsonl"),
            "trainer.checkpoint_dir": str(d / "ckpt"), "trainer.snapshot_dir": str(d / "snapshots"),
            "trainer.trace_path": str(d / "trace.jsonl"), "trainer.snapshot_every": 0,
            "serving.push_every_s": 0.0, "store.path": str(d / "store"), "hot.budget_rows": 2_000,
            "generator.events": self.events, **over}, env={})
        path = d / "config.toml"
        path.write_text(tomli_w.dumps(cfg.to_dict()))
        return path

    def _kafka_bytes(self) -> float:
        """Bytes of one event on the wire from the broker: the Arrow messages of the same synthetic events."""
        from streamrec.app.config import load_config
        from streamrec.foundation import EventSchema
        from streamrec.ingest import SyntheticStream, encode_messages

        cfg = load_config(str(self.root / "produce" / "config.toml"), env={})
        schema = EventSchema.from_sections(cfg.model, cfg.ingest)
        n = min(self.events, 20_000)
        total = 0
        for b in SyntheticStream(cfg).batches(n):
            total += sum(len(m) for m in encode_messages(b, schema, "arrow", cfg.kafka.events_per_message))
        return total / n

    def _group_cmd(self, host: int, cfg: Path, nnodes: str) -> list[str]:
        """The command a user runs on trainer host ``host`` (``nnodes``: torchrun's count or MIN:MAX)."""
        h1 = self.cluster.hosts[1]
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes, "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{h1.address}:{RDZV_PORT}",
                # the namespaces share the machine's hostname: say which host holds the rendezvous store; a lost
                # host's rendezvous slot is dropped after 3 missed 2 s heartbeats, and a smaller group forms
                # last_call_s later
                "--rdzv-conf", f"is_host={'true' if host == 1 else 'false'},last_call_timeout={self.last_call_s:g},"
                               "keep_alive_interval=2,keep_alive_max_attempt=3",
                "--local-addr", self.cluster.hosts[host].address, "--max-restarts", "5", "--monitor-interval", "1",
                "-m", "streamrec", "train", "--config", str(cfg), "--bootstrap", self.bootstrap, "--no-progress"]

    def run_group(self, name: str, mbit: float, timeout_s: float = 600.0, ranks: int | None = None,
                  **over) -> dict:
        """The group of ``ranks`` hosts (default N) over links at ``mbit`` (0: unshaped), to the end of the
        events; ``over``: config overrides (the settings that relieve a link)."""
        self.cluster.shape(mbit)
        n = ranks or self.ranks
        cfg = self._config(name, **over)
        env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
        procs = [self.cluster.spawn(h, self._group_cmd(h, cfg, str(n)), f"train-{name}", env=env)
                 for h in range(1, n + 1)]
        self._wait(procs, timeout_s, name)
        return self._figures(name)

    def run_loopback(self) -> dict:
        """The N ranks in host 1 alone, over its loopback (``streamrec train --nproc N``)."""
        cfg = self._config("loopback", **{"trainer.ranks": self.ranks})
        p = self.cluster.spawn(1, [*_streamrec(), "train", "--nproc", str(self.ranks), "--config", str(cfg),
                                   "--bootstrap", self.bootstrap, "--no-progress"], "train-loopback",
                               env={"OMP_NUM_THREADS": "1"})
        self._wait([p], 600, "loopback")
        return self._figures("loopback")

    def _wait(self, procs, timeout_s: float, name: str) -> None:
        deadline = time.monotonic() + timeout_s
        for p in procs:
            left = max(1.0, deadline - time.monotonic())
            try:
                rc = p.wait(left)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"run {name} did not finish in {timeout_s:.0f} s; logs in {self.root / 'hosts'}")
            if rc != 0:
                raise RuntimeError(f"run {name}: a rank exited {rc}; logs in {self.root / 'hosts'}")

    def _figures(self, name: str) -> dict:
        recs = [r for r in _records(self.root / name / "metrics.jsonl") if "events" in r]
        if not recs:
            raise RuntimeError(f"run {name} wrote no metrics")
        moving = [r for r in recs if r["events"] > 0]
        final = moving[-1]["events"]
        # steady state: the intervals between two records that both fall inside the training (the first record
        # comes only after the first window trained, the last one after the stream ran dry)
        steady = [(b["events"] - a["events"], b["ts"] - a["ts"]) for a, b in zip(moving, moving[1:])
                  if b["events"] < final and b["ts"] > a["ts"]]
        if len(steady) >= 2:
            rate = sum(n for n, _ in steady) / sum(t for _, t in steady)
        else:  # too short a run for a steady state: the trainer's own rate over its busiest logged interval
            rate = max(float(r.get("events_per_s") or 0.0) for r in moving)
        out = {"events": int(recs[-1]["events"]), "auc": float(recs[-1]["auc"]), "events_per_s": rate}
        mb = [r["metrics_bytes_per_s"] for r in moving if isinstance(r.get("metrics_bytes_per_s"), (int, float))
              and r["metrics_bytes_per_s"] == r["metrics_bytes_per_s"] and r["events"] < final]
        out["metrics_bytes_per_s"] = sum(mb) / len(mb) if mb else 0.0  # the group's own figures, while it trains
        for key in ("collective_bytes_per_event", "row_bytes_per_event", "dense_bytes_per_event"):
            weighted, seen, prev = 0.0, 0, 0
            for r in recs:  # each record's figure covers the events since the one before: weigh by them
                dn = r["events"] - prev
                b = r.get(key)
                if dn > 0 and isinstance(b, (int, float)) and b == b:
                    weighted += b * dn
                    seen += dn
                prev = r["events"]
            out[key] = weighted / seen if seen else float("nan")
        return out

    def _wait_going(self, name: str, procs: dict, logs: list[Path], metrics: Path) -> float:
        """Wait until the host-loss run ``name`` trains and serving answers; returns the run's deadline.
        :class:`GroupNotFormed` when host 1's torchrun gave up in the rendezvous, RuntimeError on other failures."""
        deadline = time.monotonic() + 180
        while not (any(r.get("events", 0) > 0 for r in _records(metrics))
                   and (self.root / name / "probe.ready").exists()):  # training, and serving answers
            if time.monotonic() > deadline or procs[1].poll() is not None:
                why = (f"host 1's trainer exited {procs[1].returncode}" if procs[1].returncode is not None
                       else "no training and serving within 180 s")
                tail = logs[0].read_text(errors="replace")[-2000:] if logs[0].exists() else "(no log)"
                err = GroupNotFormed if procs[1].returncode is not None and "DistStoreError" in tail else RuntimeError
                raise err(f"the host-loss run did not get going ({why}); logs in {self.root / 'hosts'}; "
                          f"host 1's trainer log ends:\n{tail}")
            time.sleep(0.1)
        return deadline

    def host_loss(self, how: str, phase: float, timeout_s: float = 600.0, group_timeout_s: float = GROUP_TIMEOUT_S,
                  mbit: float = LOSS_MBIT, idle_exit_s: float = 6.0, retried: bool = False) -> dict:
        """Lose the last host mid-run, ``phase`` of a checkpoint interval after a checkpoint, ``how``: ``kill``
        (SIGKILL to every process it runs) or ``cut`` (its link down: nothing it sends arrives, nobody gets a
        reset). The others go on as a smaller group. Serving runs on host 0 (the trainer pushes to it every
        second) and a prober there calls Predict every 50 ms throughout. ``mbit``: the links (0: unshaped);
        ``group_timeout_s``: how long a cut link goes unnoticed; ``idle_exit_s``: the group's end once the
        topic is drained. A run whose group never formed (:class:`GroupNotFormed`) is started again once."""
        self.cluster.shape(mbit)
        name = f"loss-{how}-{int(phase * 100)}" + ("-again" if retried else "")
        h0 = self.cluster.hosts[0]
        port = 50051 + len(list(self.root.glob("loss-*")))
        target = f"{h0.address}:{port}"
        cfg = self._config(name, **{"trainer.group_timeout_s": group_timeout_s, "trainer.idle_exit_s": idle_exit_s,
                                    "trainer.checkpoint_every_s": CHECKPOINT_EVERY_S, "trainer.snapshot_every": 1,
                                    "serving.push_every_s": 1.0, "serving.target": target,
                                    "serving.host": h0.address, "serving.port": port, "serving.push_token": "bench",
                                    "serving.data_dir": str(self.root / name / "serving")})
        server = self.cluster.spawn(0, [*_streamrec(), "serve", "--config", str(cfg)], f"serve-{name}")
        stop, probe_out = self.root / name / "stop-probe", self.root / name / "probe.json"
        prober = self.cluster.spawn(0, [sys.executable, "-c", PROBER, target, str(cfg), str(stop), str(probe_out)],
                                    f"probe-{name}")
        env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
        last = self.ranks
        procs = {h: self.cluster.spawn(h, self._group_cmd(h, cfg, f"1:{self.ranks}"), f"train-{name}", env=env)
                 for h in range(1, self.ranks + 1)}
        logs = [self.root / "hosts" / f"h{h}-train-{name}.log" for h in range(1, last + 1)]
        metrics = self.root / name / "metrics.jsonl"
        try:
            deadline = self._wait_going(name, procs, logs, metrics)
        except GroupNotFormed as e:
            if retried:
                raise
            print(f"  {name}: the group never formed, starting it again: {str(e).splitlines()[-1]}", flush=True)
            for h in procs:
                self.cluster.kill_host(h)
            self.cluster.kill([server, prober])  # host 0 also runs the broker: only this run's processes go
            return self.host_loss(how, phase, timeout_s, group_timeout_s, mbit, idle_exit_s, retried=True)
        ckpts = lambda: sorted(t for lg in logs for t in _log_times(lg, "checkpoint "))  # noqa: E731
        seen = len(ckpts())
        while len(ckpts()) == seen and time.monotonic() < deadline and procs[1].poll() is None:
            time.sleep(0.05)  # the next checkpoint starts the cycle
        time.sleep(phase * CHECKPOINT_EVERY_S)
        stopped_at = max(r["events"] for r in _records(metrics))
        killed = time.time()
        if how == "kill":
            self.cluster.kill_host(last)
        else:
            self.cluster.cut(last)
        rest = [procs[h] for h in range(1, last)]
        try:
            self._wait(rest, timeout_s, name)
            time.sleep(2.5)  # the final push reaches serving
        finally:
            self.cluster.kill_host(last)  # a cut host's ranks wait for a group they cannot reach
            if how == "cut":
                self.cluster.heal(last)  # the next run starts with every host on the network
            stop.touch()
            prober.wait(30)
            server.terminate()
            server.wait(30)
        restarts = [t for lg in logs[:-1] for t in _log_times(lg, "trainer group restarted") if t > killed]
        # training again: a record past the loss's count written after the smaller group's restart (a record the
        # lost group wrote between the count's read and the kill taking effect is not a recovery)
        since = min(restarts) if restarts else killed
        resumed = [r["ts"] for r in _records(metrics) if r["ts"] > since and r["events"] > stopped_at]
        probe = json.loads(probe_out.read_text()) if probe_out.exists() else {}
        from streamrec.app.config import load_config

        t = load_config(str(cfg), env={}).trainer
        before = [r for r in _records(metrics) if r["ts"] <= killed and r["events"] > 0]
        rate = ((before[-1]["events"] - before[0]["events"]) / (before[-1]["ts"] - before[0]["ts"])
                if len(before) >= 2 and before[-1]["ts"] > before[0]["ts"] else 0.0)  # the group's, up to the loss
        return {  # a restart trains again what followed the last checkpoint: one interval, and the window in hand
                "duplicates_bound": rate * CHECKPOINT_EVERY_S + t.batch_size * t.window_batches * self.ranks,
                "after_end": stopped_at >= self.events,  # every event trained before the loss: nothing to measure
                "detect_s": (min(restarts) - killed) if restarts else None,
                "recover_s": (resumed[0] - killed) if resumed else None, "events_at_loss": stopped_at,
                **self.lost_and_twice(name),
                "predict_ok": probe.get("ok"), "predict_failed": probe.get("failed"),
                "predict_max_gap_s": probe.get("max_gap_s"), "served_versions": probe.get("versions")}

    def committed(self, group: str) -> list[int]:
        """Consumer group ``group``'s committed offset of every partition of the events topic, asked from host 1
        (the broker is reachable from the hosts only)."""
        code = ("import json\nfrom kafka import KafkaConsumer, TopicPartition\n"
                f"c = KafkaConsumer(bootstrap_servers='{self.bootstrap}', group_id='{group}', enable_auto_commit=False)\n"
                f"print(json.dumps([c.committed(TopicPartition('events', p)) or 0 for p in range({PARTITIONS})]))\n"
                "c.close()")
        out = subprocess.run(["ip", "netns", "exec", self.cluster.hosts[1].ns, sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"reading the offsets of {group} failed: {out.stderr[-500:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def checkpoint_offsets(self, name: str) -> list[int]:
        """Every partition's offset in run ``name``'s newest complete checkpoint."""
        from streamrec.trainer.checkpoint import latest_checkpoint, read_checkpoint

        latest = latest_checkpoint(str(self.root / name / "ckpt"))
        if latest is None:
            return [0] * PARTITIONS
        state, _ = read_checkpoint(latest)
        by = {int(p): int(o) for _t, p, o in state["offsets"]}
        return [by.get(p, 0) for p in range(PARTITIONS)]

    def lost_and_twice(self, name: str) -> dict:
        """Run ``name``'s ``events_lost`` (the records its final checkpoint has not consumed, in events at most)
        and ``events_duplicated`` (events its ranks' traces say they trained, minus the events produced; None
        without a trace)."""
        behind = self.messages - sum(self.checkpoint_offsets(name))
        trained = sum(r.get("events", 0) for p in (self.root / name).glob("trace.jsonl*")
                      for r in _records(p) if "ranges" in r)
        return {"events_lost": behind * self.events_per_message,
                "events_duplicated": max(0, trained - self.events) if trained else None}

    def close(self) -> None:
        self.cluster.close()


def goals(r: dict) -> list[dict]:
    out = []
    vals = list(r["predicted_vs_measured"].values())  # the N-rank and the wider group's link-bound runs
    ok = bool(vals) and all(0.8 <= v <= 1.25 for v in vals)
    out.append({"goal": "predicted_vs_measured in 0.8-1.25 where the link is the bottleneck",
                "key": "predicted_vs_measured", "value": vals or None, "status": "PASS" if ok else "FAIL",
                "ok": ok, "reason": "" if vals else "no shaped link was the bottleneck"})
    st = r.get("sparse_staleness") or {}
    v = st.get("speedup_bound")
    ok = v is not None and v >= 1.5
    out.append({"goal": "sparse_staleness: events/s >= 1.5x the exact group where the link binds, AUC cost <= 0.002",
                "key": "sparse_staleness", "value": v, "status": "PASS" if ok else "FAIL", "ok": ok,
                "reason": "not measured at this size" if v is None else "" if ok else
                f"not built: a K-step stale-read cache can give at most {v:.2f}x here (K={st['speedup_bound_k']}; "
                f"{st['speedup_bound_every_row_cached']:.2f}x with no row sent at all): the dense all-reduce and "
                "the Kafka bytes stay on the link"})
    for key, test, goal in (("host_loss_detect_s", lambda v: v <= 30, "host_loss_detect_s <= 30"),
                            ("events_lost", lambda v: v == 0, "events_lost == 0")):
        v = r.get(key)
        ok = v is not None and test(v)
        out.append({"goal": goal, "key": key, "value": v, "status": "PASS" if ok else "FAIL", "ok": ok,
                    "reason": "" if v is not None else "not measured at this size"})
    return out


PROBER = """
import json, sys, time
from pathlib import Path
from streamrec.app.config import load_config
from streamrec.serving import ServingClient
target, cfg, stop, out = sys.argv[1], load_config(sys.argv[2], env={}), Path(sys.argv[3]), Path(sys.argv[4])
events = [{"dense": [0.1] * cfg.model.dense_dim, "sparse": {f: [i] for f in cfg.model.field_names}} for i in range(8)]
ok = failed = 0
versions, last_ok, gap = [], None, 0.0
client = ServingClient(target, timeout=2.0, token=cfg.serving.predict_token)
while not stop.exists():
    try:
        _, v = client.predict(events)
    except Exception:
        if last_ok is not None:
            failed += 1
        time.sleep(0.05)
        continue
    now = time.monotonic()
    if last_ok is None:
        (out.parent / "probe.ready").touch()
    else:
        gap = max(gap, now - last_ok)
    last_ok, ok = now, ok + 1
    if not versions or versions[-1] != v:
        versions.append(v)
    time.sleep(0.05)
out.write_text(json.dumps({"ok": ok, "failed": failed, "max_gap_s": gap, "versions": [versions[0], versions[-1]]
                           if versions else None, "version_changes": len(versions)}))
"""  # Predict every 50 ms from host 0 until the stop file exists; failures counted from the first answer on


def _s(v) -> str:
    return "never" if v is None else f"{v:.1f} s"


def _links(b: ClusterBench, ranks: int, mbits, prefix: str) -> dict:
    """The group of ``ranks`` hosts at each of ``mbits``, and the bandwidth model's prediction of each."""
    links = {}
    for m in mbits:
        x = b.run_group(f"{prefix}-{m}", m, ranks=ranks)
        links[str(m)] = x
        print(f"  {ranks} hosts, link {m or 'unshaped'} Mbit/s  AUC {x['auc']:.5f}  {x['events_per_s']:,.0f} "
              f"events/s  collective {x['collective_bytes_per_event']:,.0f} B/event (rows "
              f"{x['row_bytes_per_event']:,.0f}, dense {x['dense_bytes_per_event']:,.0f}); metrics "
              f"{x['metrics_bytes_per_s'] / 1e3:,.0f} kB/s", flush=True)
    base = links[str(mbits[0])]
    for m, x in links.items():
        if float(m) <= 0:
            continue
        cap = _cap(ranks, float(m), x, b.kafka_bytes_per_event)
        x["link_cap_events_per_s"] = cap
        x["link_bound"] = cap < base["events_per_s"]
        x["predicted_events_per_s"] = min(cap, base["events_per_s"])
        x["predicted_vs_measured"] = x["predicted_events_per_s"] / x["events_per_s"]
        print(f"  link {m} Mbit/s: predicted {x['predicted_events_per_s']:,.0f} events/s (link cap {cap:,.0f}), "
              f"measured {x['events_per_s']:,.0f}: {x['predicted_vs_measured']:.2f}x"
              f"{' (link-bound)' if x['link_bound'] else ''}", flush=True)
    return links


def _cap(ranks: int, mbit: float, x: dict, kafka_bytes: float) -> float:
    """Events/s links of ``mbit`` allow ``ranks`` ranks that send ``x``'s collective bytes per event, after the
    group's metrics traffic (a load per second, not per event: its figures every ``trainer.log_every_s``)."""
    free = ranks * mbit * 1e6 / 8 - x.get("metrics_bytes_per_s", 0.0)
    return max(0.0, free) / (x["collective_bytes_per_event"] + kafka_bytes)


def _reliefs(b: ClusterBench, links: dict, ranks: int) -> dict:
    """Each of ``RELIEFS`` at the most link-bound bandwidth: events/s against the exact group's there, the
    model's prediction from the run's own bytes, and the AUC it costs."""
    bound = sorted((float(m), m) for m, x in links.items() if x.get("link_bound"))
    if not bound:
        return {}
    m = bound[0][1]
    sync = links[m]
    out = {"mbit": float(m)}
    for name, over in RELIEFS.items():
        x = b.run_group(f"relief-{name}", float(m), **over)
        x["speedup"] = x["events_per_s"] / sync["events_per_s"]
        x["predicted_speedup"] = _cap(ranks, float(m), x, b.kafka_bytes_per_event) / sync["link_cap_events_per_s"]
        x["auc_cost"] = sync["auc"] - x["auc"]
        out[name] = x
        print(f"  relief {name} at {m} Mbit/s: {x['events_per_s']:,.0f} events/s ({x['speedup']:.2f}x the exact "
              f"group, predicted {x['predicted_speedup']:.2f}x from {x['collective_bytes_per_event']:,.0f} B/event), "
              f"AUC cost {x['auc_cost']:+.4f}", flush=True)
    return out


STALENESS_KS = (1, 2, 4, 8, 16)  # the stale-read bounds the bench reports


def _staleness(b: ClusterBench, links: dict, ranks: int) -> dict:
    """What a K-step stale-read cache (PERSIA's asynchronous sparse part) could give at the most link-bound
    bandwidth: the share of the row exchange's bytes a cache of each K saves on this stream
    (``benchmarks/staleness.py``, a replay of the group's steps), and the events/s bound that leaves, the
    dense all-reduce and Kafka bytes unchanged (overlap cannot beat a link that is the bottleneck)."""
    from streamrec.app.config import load_config

    from .staleness import row_traffic, speedup_bound

    bound = sorted((float(m), m) for m, x in links.items() if x.get("link_bound"))
    if not bound:
        return {}
    sync = links[bound[0][1]]
    cfg = load_config(str(b.root / "produce" / "config.toml"), env={})
    t = row_traffic(cfg, b.events, ranks, ks=STALENESS_KS, hot_set=False)  # the bench's groups get no hot set
    rows = sync["row_bytes_per_event"]
    by_k = {str(d["k"]): {"saved_fraction": d["exchange_saved_fraction"], "hit_rate": d["hit_rate"],
                          "speedup_bound": speedup_bound(rows, sync["dense_bytes_per_event"], b.kafka_bytes_per_event,
                                                         d["exchange_saved_fraction"])} for d in t["by_k"]}
    best = max(by_k.items(), key=lambda kv: kv[1]["speedup_bound"])
    out = {"mbit": bound[0][0], "built": False, "measured_row_bytes_per_event": rows,
           "replayed_row_bytes_per_event": t["k0"]["exchange_bytes_per_event"], "by_k": by_k,
           "speedup_bound": best[1]["speedup_bound"], "speedup_bound_k": int(best[0]),
           "speedup_bound_every_row_cached": speedup_bound(rows, sync["dense_bytes_per_event"],
                                                           b.kafka_bytes_per_event, 1.0)}
    print(f"  stale sparse reads at {bound[0][1]} Mbit/s: a K-step cache saves "
          + ", ".join(f"{v['saved_fraction']:.0%} (K={k})" for k, v in by_k.items())
          + f" of the row bytes ({rows:,.0f} B/event measured, {out['replayed_row_bytes_per_event']:,.0f} replayed): "
          f"at most {out['speedup_bound']:.2f}x events/s (K={best[0]}), {out['speedup_bound_every_row_cached']:.2f}x "
          "were no row ever sent", flush=True)
    return out


def _host_losses(b: ClusterBench, r: dict) -> None:
    worst = []
    for how in ("kill", "cut"):
        for phase in LOSS_PHASES:
            x = b.host_loss(how, phase)
            r[f"host_loss_{how}_{int(phase * 100)}"] = x
            worst.append(x)
            print(f"  host lost ({how}, {phase:.0%} into a checkpoint interval): a smaller group after "
                  f"{_s(x['detect_s'])}, training again after {_s(x['recover_s'])}; events lost "
                  f"{x['events_lost']}, trained twice {x['events_duplicated']} (bound {x['duplicates_bound']:,.0f}); "
                  f"Predict {x['predict_ok']} ok, {x['predict_failed']} failed, longest gap "
                  f"{_s(x['predict_max_gap_s'])}, versions {x['served_versions']}", flush=True)
    measured = [x for x in worst if not x["after_end"]]  # a loss after the last event measures nothing
    det = [x["detect_s"] for x in measured]
    rec = [x["recover_s"] for x in measured]
    r["host_loss_runs_measured"] = len(measured)
    r["host_loss_detect_s"] = None if not det or None in det else max(det)
    r["host_loss_recover_s"] = None if not rec or None in rec else max(rec)
    r["events_lost"] = sum(x["events_lost"] for x in worst)
    r["events_duplicated"] = max((x["events_duplicated"] or 0) for x in worst)
    r["duplicates_within_bound"] = all(x["events_duplicated"] is not None and x["events_duplicated"]
                                       <= x["duplicates_bound"] for x in worst)
    r["predict_failed_during_loss"] = sum(x["predict_failed"] or 0 for x in worst)
    from .cluster_services import services_loss

    for how in ("kill", "cut"):
        x = services_loss(b, how, SERVICES_MBIT)
        r[f"services_{how}"] = x
        r["events_lost"] += x["events_lost"]
        r["predict_failed_during_loss"] += x["predict_failed"] or 0
        print(f"  services host lost ({how}: serving replica + sketch worker) and back after 5 s: training's "
              f"longest pause {_s(x['train_max_gap_s'])}, {x['events_per_s_before'] or 0:,.0f} -> "
              f"{x['events_per_s_after'] or 0:,.0f} events/s; events lost {x['events_lost']}, trained twice "
              f"{x['events_duplicated']}; the other replica: Predict {x['predict_failed']} failed, versions "
              f"{x['served_version_at_loss']} -> {x['served_version_end']}; hot set v{x['hot_version_at_loss']} -> "
              f"v{x['hot_version_end']}; returned replica caught up after {_s(x['replica_caught_up_s'])}", flush=True)


def run(size: str) -> dict:
    from .netns import available

    why = available()
    if why:
        raise RuntimeError(f"streamrec bench cluster needs network namespaces: {why}")
    events, mbits, ranks, loss, wide = SIZES[size]
    root = Path(tempfile.mkdtemp(prefix="streamrec-bench-cluster-"))
    t0 = time.perf_counter()
    b = ClusterBench(root, ranks, events, trainer_hosts=WIDE if wide else ranks)
    r: dict = {"size": size, "ranks": ranks, "events": events, "kafka_bytes_per_event": b.kafka_bytes_per_event}
    try:
        print(f"cluster bench: {ranks} trainer hosts + a broker host, {events:,} events, "
              f"{b.kafka_bytes_per_event:.0f} Kafka B/event", flush=True)
        lb = b.run_loopback()
        print(f"  loopback ({ranks} ranks, one host)  AUC {lb['auc']:.5f}  {lb['events_per_s']:,.0f} events/s", flush=True)
        r["loopback"] = lb
        links = _links(b, ranks, mbits, "link")
        base = links[str(mbits[0])]
        r["auc_cluster_minus_loopback"] = base["auc"] - lb["auc"]
        committed = b.committed(f"trainer-link-{mbits[0]}")
        # every record trained and its offset committed, as far as the final checkpoint says
        r["offsets_committed"] = bool(sum(committed) == b.messages and committed == b.checkpoint_offsets(
            f"link-{mbits[0]}"))
        r["links"] = links
        r["predicted_vs_measured"] = {m: x["predicted_vs_measured"] for m, x in links.items() if x.get("link_bound")}
        if wide:
            r[f"links_{WIDE}"] = wl = _links(b, WIDE, wide, f"wide{WIDE}")
            r["predicted_vs_measured"].update({f"{WIDE}x{m}": x["predicted_vs_measured"] for m, x in wl.items()
                                               if x.get("link_bound")})
        r["reliefs"] = _reliefs(b, links, ranks) if loss else {}
        r["sparse_staleness"] = _staleness(b, links, ranks) if loss else {}
        r.update({"host_loss_detect_s": None, "host_loss_recover_s": None, "events_lost": None,
                  "events_duplicated": None})
        if loss:
            _host_losses(b, r)
    finally:
        b.close()
    r["seconds"] = round(time.perf_counter() - t0, 1)
    shutil.rmtree(root, ignore_errors=True)
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamrec bench cluster", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="150k events, links 1000/100/20 Mbit/s, a host lost")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: checks the bench works, its figures mean little")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv or [])
    size = "tiny" if args.tiny else "quick" if args.quick else "full"
    import signal

    # a SIGTERM unwinds like Ctrl-C, so the hosts' processes and namespaces are removed on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    r = run(size)
    gs = goals(r)
    for g in gs:
        print(f"  goal {g['status']}: {g['goal']} ({g['key']} = {g['value']}){'; ' + g['reason'] if g['reason'] else ''}")
    r["goals"] = gs
    results = Path(__file__).resolve().parent / "results"
    if size != "tiny" and results.is_dir():
        (results / f"cluster-{size}.json").write_text(json.dumps(r, indent=1) + "\n")
    if args.json:
        print(json.dumps(r))
    return 0
