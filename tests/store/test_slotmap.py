"""SlotMap (the host cache's id -> slot hash table) against a dict, through inserts,
removals, tombstone reuse and rebuilds."""

import numpy as np

from streamrec.embedding_store.slotmap import SlotMap


def test_slotmap_matches_a_dict_through_churn():
    rng = np.random.default_rng(3)
    m, ref = SlotMap(300), {}
    universe = np.concatenate([rng.integers(-2**63, 2**63 - 1, 400, dtype=np.int64), np.arange(-50, 50)])
    for step in range(300):
        absent = np.array([i for i in rng.choice(universe, 40, replace=False) if int(i) not in ref], dtype=np.int64)
        room = 300 - len(ref)
        new = absent[:room]
        slots = rng.integers(0, 1000, len(new))
        m.insert(new, slots)
        ref.update(zip(new.tolist(), slots.tolist()))
        if step % 3 == 0 and ref:
            keys = np.array(list(ref), dtype=np.int64)
            gone = rng.choice(keys, min(len(keys), 60), replace=False)
            m.remove(np.concatenate([gone, absent[room:]]))  # absent ids are ignored
            for g in gone.tolist():
                del ref[g]
        q = rng.choice(universe, 200)
        want = np.array([ref.get(int(i), -1) for i in q])
        np.testing.assert_array_equal(m.get(q), want)
        assert len(m) == len(ref)
    assert m.live + m.deleted <= len(m.vals) * 3 // 4  # tombstones were reclaimed by rebuilds
