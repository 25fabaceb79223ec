"""Each extension point named in ARCHITECTURE.md is a Protocol that its built-in implementation
satisfies, exported from its package's public surface."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def test_architecture_names_each_protocol_with_its_module_and_implementation():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## Extension points", 1)[1].split("\n## ", 1)[0]
    for protocol, module, impl in [("ColdTier", "embedding_store/store_types.py", "RocksDBColdTier"),
                                   ("HotSetSource", "trainer/hotset_types.py", "TopicHotSource"),
                                   ("Pusher", "streamrec/snapshot/push_types.py", "SnapshotPusher"),
                                   ("RankingModel", "streamrec/model/model_types.py", "DLRM")]:
        row = next((line for line in section.splitlines() if line.startswith(f"| `{protocol}`")), None)
        assert row is not None, protocol
        assert f"`{module}`" in row and f"`{impl}`" in row, row
        assert re.search(rf"class {protocol}\(Protocol\)", (ROOT / module).read_text()), module


def test_the_cold_tier_protocol_is_satisfied_by_rocksdb(tmp_path):
    from streamrec.embedding_store import ColdTier, RocksDBColdTier

    tier = RocksDBColdTier(str(tmp_path), shards=1, block_cache_mb=8)
    try:
        assert isinstance(tier, ColdTier)
    finally:
        tier.close()


def test_the_hot_set_sources_satisfy_their_protocol():
    from streamrec.trainer import HotSetSource, SampleHotSource, TopicHotSource
    from streamrec.trainer.hotset import NoHotSource

    assert isinstance(SampleHotSource(["f"], budget=4), HotSetSource)
    assert isinstance(NoHotSource(), HotSetSource)
    for name in ("observe", "poll", "close"):  # the topic follower needs a broker to construct
        assert callable(getattr(TopicHotSource, name))
    assert not isinstance(object(), HotSetSource)


def test_the_grpc_pusher_satisfies_the_pusher_protocol():
    from streamrec.app.config import Config
    from streamrec.serving import SnapshotPusher
    from streamrec.snapshot import Pusher

    pusher = SnapshotPusher.factory(Config())("127.0.0.1:9")  # a channel connects lazily: no server needed
    try:
        assert isinstance(pusher, Pusher)
    finally:
        pusher.close()
    assert not isinstance(np.zeros(1), Pusher)


def test_the_built_in_model_satisfies_the_model_protocol(tmp_path):
    import torch

    from streamrec.model import DLRM, RankingModel, build_model
    from tests.conftest import small_config

    cfg = small_config(tmp_path)
    model = build_model(cfg.model)
    assert isinstance(model, DLRM) and isinstance(model, RankingModel)
    b = 5
    logits = model(torch.zeros(b, cfg.model.dense_dim), torch.ones(b, cfg.model.pooled_dim))
    assert logits.shape == (b, len(cfg.model.tasks))
    # deterministic in model.seed: every rank and every restart starts from the same weights
    again = build_model(cfg.model)
    assert all(torch.equal(a, c) for a, c in zip(model.state_dict().values(), again.state_dict().values()))
    assert not isinstance(object(), RankingModel)
