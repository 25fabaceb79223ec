"""The partitions keyed sends would choose, for many keys at once: Kafka's default partitioner (murmur2 of
the key, as the Java client and aiokafka compute it) over numpy arrays instead of one key at a time.

The joiner writes each example to the events partition its ``request_id`` hashes to; hashing a batch's keys
together costs a fraction of a microsecond a key where the pure-Python murmur2 costs several.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C


def murmur2_many(keys: Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of each key (uint32; ``aiokafka.partitioner.murmur2`` gives the same bits)."""
    out = np.empty(len(keys), np.uint32)
    by_len: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        by_len.setdefault(len(k), []).append(i)
    with np.errstate(over="ignore"):
        for n, rows in by_len.items():
            data = np.frombuffer(b"".join(keys[i] for i in rows), np.uint8).reshape(len(rows), n)
            h = np.full(len(rows), _SEED ^ n, np.uint32)
            whole = n // 4 * 4
            if whole:
                words = data[:, :whole].copy().view("<u4")  # little-endian 4-byte words, as Java reads them
                for j in range(words.shape[1]):
                    k = words[:, j] * _M
                    k ^= k >> np.uint32(24)
                    k *= _M
                    h *= _M
                    h ^= k
            extra = n - whole
            if extra >= 3:
                h ^= data[:, whole + 2].astype(np.uint32) << np.uint32(16)
            if extra >= 2:
                h ^= data[:, whole + 1].astype(np.uint32) << np.uint32(8)
            if extra >= 1:
                h ^= data[:, whole].astype(np.uint32)
                h *= _M
            h ^= h >> np.uint32(13)
            h *= _M
            h ^= h >> np.uint32(15)
            out[rows] = h
    return out


def partitions_of(keys: Sequence[bytes], partitions: Sequence[int]) -> list[int]:
    """The partition of ``partitions`` (sorted, all of the topic's) a keyed send of each key goes to:
    ``partitions[(murmur2(key) & 0x7fffffff) % len(partitions)]``, as the default partitioner chooses."""
    if not keys:
        return []
    idx = (murmur2_many(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(len(partitions))
    table = np.asarray(partitions)
    return table[idx].tolist()
