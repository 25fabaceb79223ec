"""Row-wise sharding of the embedding tables over the ranks of a trainer group.

Every ``(table, id)`` has exactly one owner rank, :func:`owner_of`: a stable hash
of the table's salt and the id, modulo the world size. Nothing is stored about it,
so any process (a restarted rank, ``streamrec reshard``, a test) computes the same
owner without talking to anyone, and a world-size change moves only rows whose
owner changed.

:class:`RowExchange` is one step's traffic (TorchRec's row-wise sharding, done with
``torch.distributed`` collectives): every rank sends its batch's unique ids to their
owners (``all_to_all``), owners read the rows from their own store and send them
back; after backward the row gradients travel the same way in reverse, the owner
sums the contributions of all ranks for a row and applies row-wise Adagrad once, so
N ranks apply exactly the update one trainer would on the union of their batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from streamrec.foundation.ids import salted_mix, table_salt

SHARDING = "splitmix64(id ^ xxh64(table)) % world"  # recorded in every group checkpoint's manifest
_OWNER_SALT = 0x5EED_0F_0A7E_2  # a fixed tweak so owners do not correlate with the store's own shard choice


def owner_of(table: str, ids: np.ndarray, world: int) -> np.ndarray:
    """The owner rank (int64) of each id of ``table`` in a group of ``world`` ranks."""
    ids = np.asarray(ids, dtype=np.int64)
    if world <= 1:
        return np.zeros(len(ids), np.int64)
    return (salted_mix(table_salt(table) ^ _OWNER_SALT, ids) % np.uint64(world)).astype(np.int64)


def owned_part(tables: Mapping[str, np.ndarray], rank: int, world: int) -> dict[str, np.ndarray]:
    """The ids of each table that ``rank`` owns."""
    out = {}
    for t, ids in tables.items():
        ids = np.asarray(ids, dtype=np.int64)
        out[t] = ids[owner_of(t, ids, world) == rank]
    return out


@dataclass
class _Route:
    """One step's routing, kept between the row fetch and the gradient return."""

    order: np.ndarray  # local unique ids (all fields concatenated) -> position sorted by (owner, field)
    sizes: list[np.ndarray]  # per field, how many unique ids this rank has
    send: list[int]  # ids sent to each rank
    recv: list[int]  # ids received from each rank
    owned: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]  # per field: (field, received positions, ids, inverse)
    batch_sizes: np.ndarray  # every rank's events in this step


class RowExchange:
    """Fetch rows from, and return row gradients to, their owner ranks.

    ``lookup(table, unique_ids) -> Tensor`` and ``apply_gradients(table, unique_ids, grads)``
    are the rank's own store (tiered: its hot rows on the device, cold ones in its RocksDB
    shard). Every rank of the group must call :meth:`fetch` and :meth:`give_back` the same
    number of times, in the same order, even with nothing to send (an idle rank joins
    with an empty batch): they are collectives. ``bytes_sent`` counts this rank's payload.
    """

    def __init__(self, fields: Sequence[str], dim: int, lookup: Callable, apply_gradients: Callable,
                 rank: int, world: int, group=None, comm_device: torch.device | str = "cpu"):
        self.fields = list(fields)
        self.dim = int(dim)
        self.lookup = lookup
        self.apply_gradients = apply_gradients
        self.rank, self.world = int(rank), int(world)
        self.group = group
        self.comm = torch.device(comm_device)  # where collective buffers live: cpu for gloo, the GPU for NCCL
        self.bytes_sent = 0
        self._route: _Route | None = None

    def _a2a(self, send: torch.Tensor, recv_rows: list[int], send_rows: list[int]) -> torch.Tensor:
        out = torch.empty((sum(recv_rows),) + tuple(send.shape[1:]), dtype=send.dtype, device=self.comm)
        dist.all_to_all_single(out, send.to(self.comm).contiguous(), output_split_sizes=recv_rows, input_split_sizes=send_rows,
                               group=self.group)
        row_bytes = send.element_size() * (int(np.prod(send.shape[1:])) if send.dim() > 1 else 1)
        self.bytes_sent += (sum(send_rows) - send_rows[self.rank]) * row_bytes  # what leaves this rank
        return out

    def fetch(self, uniques: Mapping[str, np.ndarray], batch_size: int) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        """Rows for this rank's unique ids of every field; and every rank's batch size this step."""
        W, F = self.world, len(self.fields)
        ids_all, owner_all, field_all, sizes = [], [], [], []
        for fi, f in enumerate(self.fields):
            u = np.asarray(uniques[f], dtype=np.int64)
            ids_all.append(u)
            owner_all.append(owner_of(f, u, W))
            field_all.append(np.full(len(u), fi, np.int64))
            sizes.append(len(u))
        ids = np.concatenate(ids_all)
        owner, field = np.concatenate(owner_all), np.concatenate(field_all)
        order = np.lexsort((field, owner))  # by owner, then field; stable within a field
        counts = np.zeros((W, F + 1), np.int64)
        np.add.at(counts, (owner, field), 1)
        counts[:, F] = batch_size  # every rank learns every rank's batch size in the same message
        got = torch.empty(W * (F + 1), dtype=torch.int64, device=self.comm)
        dist.all_to_all_single(got, torch.from_numpy(counts.reshape(-1)).to(self.comm), group=self.group)
        self.bytes_sent += (W - 1) * (F + 1) * 8
        got = got.cpu().numpy().reshape(W, F + 1)
        batch_sizes = got[:, F].copy()
        recv_counts = got[:, :F]
        send = counts[:, :F].sum(1).tolist()
        recv = recv_counts.sum(1).tolist()
        rids = self._a2a(torch.from_numpy(ids[order]), recv, send).cpu().numpy()
        # received ids are grouped by source rank, then field: label each with its field
        rfield = np.repeat(np.tile(np.arange(F), W), recv_counts.reshape(-1))
        rows_out = torch.empty((len(rids), self.dim), dtype=torch.float32, device=self.comm)
        owned = []
        for fi, f in enumerate(self.fields):
            pos = np.flatnonzero(rfield == fi)
            if not len(pos):
                owned.append((fi, pos, np.zeros(0, np.int64), np.zeros(0, np.int64)))
                continue
            u, inv = np.unique(rids[pos], return_inverse=True)  # one read per row, however many ranks ask
            rows = self.lookup(f, u).detach().to(self.comm, torch.float32)
            rows_out[torch.from_numpy(pos).to(self.comm)] = rows[torch.from_numpy(inv.reshape(-1)).to(self.comm)]
            owned.append((fi, pos, u, inv.reshape(-1)))
        back = self._a2a(rows_out, send, recv)
        mine = torch.empty_like(back)
        mine[torch.from_numpy(order).to(self.comm)] = back
        out, at = {}, 0
        for f, n in zip(self.fields, sizes):
            out[f] = mine[at:at + n]
            at += n
        self._route = _Route(order, sizes, send, recv, owned, batch_sizes)
        return out, batch_sizes

    def give_back(self, grads: Mapping[str, torch.Tensor | None]) -> None:
        """Send the row gradients of the last :meth:`fetch` to their owners, who sum and apply them.
        A refused step (not finite anywhere in the group) skips this on every rank."""
        r = self._route
        if r is None:
            raise RuntimeError("give_back without a fetch")
        self._route = None
        parts = []
        for f, n in zip(self.fields, r.sizes):
            g = grads.get(f)
            parts.append(torch.zeros((n, self.dim), device=self.comm) if g is None
                         else g.detach().to(self.comm, torch.float32).reshape(n, self.dim))
        g_all = torch.cat(parts)
        got = self._a2a(g_all[torch.from_numpy(r.order).to(self.comm)], r.recv, r.send)
        for fi, pos, u, inv in r.owned:
            if not len(u):
                continue
            summed = torch.zeros((len(u), self.dim), dtype=torch.float32, device=self.comm)
            summed.index_add_(0, torch.from_numpy(inv).to(self.comm), got[torch.from_numpy(pos).to(self.comm)])
            self.apply_gradients(self.fields[fi], u, summed)
