"""Checkpoints that rot on disk: a flipped byte in a store file or the dense weights of
the newest checkpoint is caught by its checksums, the checkpoint is set aside naming
the file, and the trainer falls back to the previous one and re-reads Kafka from its
offsets, ending where an undisturbed run ends."""

from __future__ import annotations

import shutil

import pytest

from streamrec.app.wiring import trainer_settings
from streamrec.ingest import EventProducer, EventSchema, SyntheticStream
from streamrec.trainer import TrainerService
from streamrec.trainer.checkpoint import CheckpointError, list_checkpoints, verify_checkpoint, write_checkpoint



def _cfg(cfg):
    t = cfg.trainer
    t.batch_size, t.window_batches, t.device = 128, 2, "cpu"
    t.checkpoint_every_events, t.checkpoint_every_s, t.keep_checkpoints = 512, 600.0, 5
    t.hot_source, t.snapshot_every, t.idle_exit_s, t.log_every_s = "none", 0, 1.5, 600.0
    cfg.kafka.consumer_mode, cfg.kafka.events_per_message = "assign", 64
    return cfg


def _flip(path, at=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_checksums_name_the_corrupt_file(tmp_path):
    root = tmp_path / "ckpts"
    (tmp_path / "src").mkdir()

    def write_store(d):
        d.mkdir()
        (d / "000012.sst").write_bytes(b"x" * 4096)
        return {"epoch": 1}

    p = write_checkpoint(root, 1, {"offsets": []}, {"w": 1}, write_store)
    assert verify_checkpoint(p) is True
    _flip(p / "store" / "000012.sst")
    with pytest.raises(CheckpointError, match=r"000012\.sst: sha256 does not match"):
        verify_checkpoint(p)
    (p / "store" / "000012.sst").write_bytes(b"x" * 10)
    with pytest.raises(CheckpointError, match="truncated"):
        verify_checkpoint(p)


@pytest.mark.parametrize("victim", ["sst", "store-own-file", "dense.pt"])
def test_a_corrupt_newest_checkpoint_falls_back_and_replays_from_kafka(topics, tmp_path, bootstrap, victim):
    cfg = _cfg(topics)
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for b in SyntheticStream(cfg).batches(2048):
        prod.send_batch(b)
    prod.close()
    reference_dir = tmp_path / "reference-ckpts"
    first = TrainerService(trainer_settings(cfg), bootstrap, progress=False).run()
    assert first["events"] == 2048
    shutil.copytree(cfg.trainer.checkpoint_dir, reference_dir)
    cks = list_checkpoints(cfg.trainer.checkpoint_dir)
    assert len(cks) >= 2
    newest = cks[-1][1]
    files = [p for p in (newest / "store").rglob("*") if p.is_file()]
    if victim == "sst":  # immutable, hard-linked into every later checkpoint (and the live store)
        target = max((p for p in files if p.suffix == ".sst"), key=lambda p: p.stat().st_size)
    elif victim == "store-own-file":  # a file only this checkpoint has (RocksDB's MANIFEST, log, options)
        target = max((p for p in files if p.stat().st_nlink == 1), key=lambda p: p.stat().st_size)
    else:
        target = newest / victim
    inode = target.stat().st_ino
    sharing = {p for _, p in cks if any(f.stat().st_ino == inode for f in p.rglob("*") if f.is_file())}
    intact = [p for _, p in cks if p not in sharing]
    _flip(target)

    again = TrainerService(trainer_settings(cfg), bootstrap, progress=False)
    assert again.refused_checkpoints and target.name in again.refused_checkpoints[0]
    assert len(again.refused_checkpoints) == len(sharing)  # every checkpoint holding that inode, none other
    assert again.resumed_from == (str(intact[-1]) if intact else None)
    assert (newest.parent / ("corrupt-" + newest.name)).exists()
    second = again.run()
    assert second["events"] == 2048  # the events after the previous checkpoint were read again, once
    assert abs(second["auc"] - first["auc"]) < 0.01


def test_a_run_that_restores_nothing_numbers_its_checkpoints_after_every_number_in_use(tmp_path):
    """A group whose every manifest was set aside still holds its ranks' shard checkpoints; a checkpoint
    numbered below them would be pruned as the oldest the moment it is written."""
    from streamrec.trainer.checkpoint import highest_seq, prune

    root = tmp_path / "ckpts"
    assert highest_seq(root) == 0
    for seq in (31, 32, 33):
        write_checkpoint(root / "rank-000", seq, {"offsets": []}, {"w": 1}, lambda d: {})
    (root / "corrupt-ckpt-000000034").mkdir(parents=True)
    assert highest_seq(root) == 34
    nxt = highest_seq(root) + 1
    write_checkpoint(root / "rank-000", nxt, {"offsets": []}, {"w": 1}, lambda d: {})
    prune(root / "rank-000", keep=3)
    assert [s for s, _ in list_checkpoints(root / "rank-000")] == [32, 33, nxt]
