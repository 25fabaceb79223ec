"""Row identity and layout: table tags, RocksDB keys, shard placement, packed records,
and the deterministic initial vectors.

Everything here is vectorised over a batch of ids (numpy), because the store's hot
path must not run Python per id.
"""

from __future__ import annotations

import numpy as np

from streamrec.foundation import salted_mix, splitmix64, table_salt

__all__ = ["splitmix64", "table_salt"]  # re-exported for the store's own modules

_GOLD = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment: init_rows' counter step per element

_INIT_CHUNK = 8192  # rows per init_rows pass: a big promotion would otherwise peak at ~500 B/row
KEY_BYTES = 13  # 4-byte table tag + 8-byte id (big-endian) + 0x01 terminator
_KEY_DTYPE = np.dtype([("tag", ">u4"), ("id", ">i8"), ("end", "u1")])


def unique_sorted(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` for a 1-D array, by a sort and a neighbour compare. numpy >= 2.3 answers a
    plain ``np.unique`` with a hash table and then sorts it, which is several times slower on
    a batch of ids; ``prefetch`` calls this once per batch."""
    s = np.sort(a)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def table_tag(name: str) -> int:
    """4-byte key prefix of a table (top bits of its salt)."""
    return table_salt(name) >> 32


def encode_keys(tag: int, ids: np.ndarray) -> list[bytes]:
    """RocksDB keys for ``ids`` of one table.

    The 0x01 terminator lets numpy's fixed-width bytes dtype (which strips trailing
    NULs) turn the whole array into Python ``bytes`` in one vectorised ``tolist``.
    """
    k = np.empty(len(ids), dtype=_KEY_DTYPE)
    k["tag"] = tag
    k["id"] = ids
    k["end"] = 1
    return k.view(f"S{KEY_BYTES}").tolist()


def decode_keys(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(tags, ids) of a list of row keys."""
    k = np.frombuffer(b"".join(keys), dtype=_KEY_DTYPE)
    return k["tag"].astype(np.int64), k["id"].astype(np.int64)


def shard_of(salt: int, ids: np.ndarray, shards: int) -> np.ndarray:
    """Shard index per id: a stable hash of (table, id) — no per-id Python."""
    return (salted_mix(salt, ids) % np.uint64(shards)).astype(np.int64)


def record_dtype(dim: int) -> np.dtype:
    """Packed value of one row: embedding, Adagrad accumulator, last-touched time,
    epoch of last change (for delta export) and a 0x01 terminator (see encode_keys)."""
    return np.dtype([("w", "<f4", (dim,)), ("acc", "<f4"), ("ts", "<f8"), ("ep", "<u4"), ("end", "u1")])


def raw(rec: np.ndarray) -> np.ndarray:
    """The same records as opaque fixed-size blobs (a view). numpy moves those with one
    memcpy each; structured records go field by field, several times slower to gather and
    to scatter, and every batch crosses a tier boundary."""
    return rec.view(np.dtype((np.void, rec.dtype.itemsize)))


def gather(rec: np.ndarray, idx) -> np.ndarray:
    """``rec[idx]`` (records) at memcpy speed."""
    return raw(rec)[idx].view(rec.dtype)


def scatter(dst: np.ndarray, idx, src: np.ndarray) -> None:
    """``dst[idx] = src`` (records) at memcpy speed."""
    raw(dst)[idx] = raw(src)


def pack_records(rec: np.ndarray) -> list[bytes]:
    rec["end"] = 1
    return rec.view(f"S{rec.dtype.itemsize}").tolist()


def unpack_records(values: list[bytes], dtype: np.dtype) -> np.ndarray:
    if not values:
        return np.empty(0, dtype=dtype)
    raw = b"".join(values)
    if len(raw) != len(values) * dtype.itemsize:
        raise ValueError(f"stored rows have the wrong size for {dtype.itemsize}-byte records "
                         "(store written with another embedding dim?)")
    return np.frombuffer(raw, dtype=dtype).copy()


def init_rows(salt: int, seed: int, ids: np.ndarray, dim: int, scale: float) -> np.ndarray:
    """Deterministic initial vectors, uniform in [-scale, scale), float32 ``[n, dim]``.

    Counter-based: element (id, j) is splitmix64 of a mix of (table salt, seed, id, j),
    so any process computes the same row without coordination.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) > _INIT_CHUNK:  # bounded temporaries (several uint64 [n, dim] arrays per call)
        return np.concatenate([init_rows(salt, seed, ids[lo:lo + _INIT_CHUNK], dim, scale)
                               for lo in range(0, len(ids), _INIT_CHUNK)])
    base = splitmix64(ids.astype(np.uint64) ^ np.uint64(salt)) ^ splitmix64(np.array([seed], dtype=np.uint64))
    with np.errstate(over="ignore"):
        ctr = base[:, None] + np.arange(dim, dtype=np.uint64)[None, :] * _GOLD
    h = splitmix64(ctr)
    u = (h >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))  # [0, 1), exact in float32
    return ((u * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)).astype(np.float32)
