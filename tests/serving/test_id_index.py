"""The compiled id index that resolves Predict ids against a served version's memory rows."""

import numpy as np

from streamrec.serving.idindex import IdIndex


def test_index_agrees_with_a_dict_on_hits_and_misses():
    rng = np.random.default_rng(3)
    ids = np.unique(np.concatenate([rng.integers(-2**63, 2**63 - 1, 5000, dtype=np.int64),
                                    np.arange(-50, 50, dtype=np.int64)]))  # sequential ids collide under weak hashes
    rows = rng.permutation(len(ids)).astype(np.int64) + 7
    idx = IdIndex(ids, rows)
    want = dict(zip(ids.tolist(), rows.tolist()))
    query = np.concatenate([rng.choice(ids, 3000), rng.integers(-2**63, 2**63 - 1, 1000, dtype=np.int64),
                            np.arange(-80, 80, dtype=np.int64)])
    got, misses = idx.find(query, -1)
    expect = np.array([want.get(q, -1) for q in query.tolist()])
    assert np.array_equal(got, expect)
    assert misses == int((expect == -1).sum()) > 0


def test_empty_index_misses_everything():
    got, misses = IdIndex(np.empty(0, np.int64)).find(np.array([1, 2, 3], np.int64), 99)
    assert got.tolist() == [99, 99, 99] and misses == 3
