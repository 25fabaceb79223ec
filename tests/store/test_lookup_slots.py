"""The slots a lookup remembers for apply_gradients must follow the ids, not the array object."""

from __future__ import annotations

import numpy as np
import torch

from streamrec.embedding_store import EmbeddingStore, StoreSpec


def test_apply_after_caller_reuses_ids_buffer(tmp_path):
    """A caller that refills its ids buffer in place between lookup and apply must update the new ids."""
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"a": 4}, shards=1, host_cache_rows=64)) as store:
        buf = np.array([1, 2, 3], dtype=np.int64)
        before = store.peek("a", np.array([1, 2, 3, 4, 5, 6])).clone()
        store.lookup("a", buf)
        buf[:] = [4, 5, 6]  # same array object, other ids
        store.apply_gradients("a", buf, torch.ones((3, 4), dtype=torch.float32))
        after = store.peek("a", np.array([1, 2, 3, 4, 5, 6]))
        assert torch.equal(after[:3], before[:3]), "rows 1-3 got the gradient meant for rows 4-6"
        assert not torch.equal(after[3:], before[3:]), "rows 4-6 did not get their gradient"
