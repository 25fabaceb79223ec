"""The batched partitioner chooses, for every key, the partition a keyed send chooses (aiokafka's default
partitioner: murmur2 of the key, as the Java client), whatever the keys' lengths and bytes."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner, murmur2

from streamrec.joiner.key_partitions import murmur2_many, partitions_of


def test_murmur2_of_many_keys_is_kafkas():
    rng = random.Random(7)
    keys = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 37))) for _ in range(3000)]
    keys += [b"", b"a", "é-request".encode(), b"request-00000001"]
    assert [int(h) for h in murmur2_many(keys)] == [murmur2(k) & 0xFFFFFFFF for k in keys]


def test_partitions_are_a_keyed_sends():
    rng = random.Random(8)
    keys = [f"r{rng.randrange(10**9)}".encode() for _ in range(2000)]
    choose = DefaultPartitioner()
    for parts in ([0], [0, 1, 2, 3], [2, 5, 7]):
        assert partitions_of(keys, parts) == [choose(k, parts, parts) for k in keys]
    assert partitions_of([], [0, 1]) == []
