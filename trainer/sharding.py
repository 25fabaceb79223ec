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

Wire formats (TorchRec's quantized comms, ``QCommsConfig``): ids travel as int32 in a
step where every rank's ids fit (lossless; every rank learns the others' answer in the
counts message it already sends), else int64. Rows and row gradients travel in
``precision``: ``fp32`` (exact), ``bf16`` (fp32's exponent range, 8-bit mantissa: 2 B
per value, nothing overflows that fp32 holds) or ``fp16`` (11-bit mantissa, each row
scaled by a power of two sent with it as one more fp16 value, so no row overflows and
small rows keep 11 bits: 2 B per value + 2 B per row). Only the wire is narrow: owners keep fp32
rows and Adagrad state, sum the decoded fp32 gradients and apply them in fp32. A rank's
own rows pass through the same all_to_all, so every forward sees rows as they come off
the wire (as in TorchRec).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, get_args

import numpy as np
import torch
import torch.distributed as dist

from streamrec.foundation.ids import salted_mix, splitmix64, table_salt

from .trainer_types import Precision

SHARDING = "splitmix64(id ^ xxh64(table)) % world"  # recorded in every group checkpoint's manifest
_OWNER_SALT = 0x5EED_0F_0A7E_2  # a fixed tweak so owners do not correlate with the store's own shard choice
PRECISIONS = get_args(Precision)  # wire formats of rows and gradients (trainer.exchange_precision)
_I32 = np.iinfo(np.int32)


def wire_bytes_per_row(precision: str, dim: int) -> int:
    """Bytes one row (or one row gradient) of ``dim`` values takes on the wire in ``precision``."""
    return {"fp32": 4 * dim, "bf16": 2 * dim, "fp16": 2 * dim + 2}[precision]


def encode_rows(x: torch.Tensor, precision: str) -> torch.Tensor:
    """fp32 rows ``(n, dim)`` in their wire format (see the module docstring); :func:`decode_rows` inverts it."""
    if precision == "fp32":
        return x
    if precision == "bf16":
        return x.to(torch.bfloat16)
    if precision != "fp16":
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    # a power of two per row puts the row's largest |value| in [2^14, 2^15): exact scaling, no fp16 overflow,
    # and small rows (gradients are ~1e-4) keep fp16's 11 mantissa bits instead of turning subnormal
    _, e = torch.frexp(x.abs().amax(1) if len(x) else x.new_zeros(0))
    k = (15 - e).clamp(-1000, 1000)  # an all-zero row has e = 0: k = 15, harmless
    k = torch.where(torch.isfinite(x).all(1), k, torch.zeros_like(k))  # a non-finite row stays non-finite
    return torch.cat([torch.ldexp(x, k[:, None].to(x.dtype)).to(torch.float16), k[:, None].to(torch.float16)], 1)


def decode_rows(y: torch.Tensor, precision: str) -> torch.Tensor:
    """fp32 rows from :func:`encode_rows`' wire format."""
    if precision == "fp32":
        return y
    if precision == "bf16":
        return y.float()
    return torch.ldexp(y[:, :-1].float(), -y[:, -1:].float())


def owner_of(table: str, ids: np.ndarray, world: int) -> np.ndarray:
    """The owner rank (int64) of each id of ``table`` in a group of ``world`` ranks."""
    ids = np.asarray(ids, dtype=np.int64)
    if world <= 1:
        return np.zeros(len(ids), np.int64)
    return (salted_mix(table_salt(table) ^ _OWNER_SALT, ids) % np.uint64(world)).astype(np.int64)


def owners_of_fields(fields: Sequence[str], ids: np.ndarray, field_of: np.ndarray, world: int) -> np.ndarray:
    """:func:`owner_of` for ids of several tables at once: ``ids[i]`` belongs to table
    ``fields[field_of[i]]``. One hash over all of them instead of one call per table (a step's
    26 small calls cost more than the hashing); the same owners, bit for bit."""
    ids = np.asarray(ids, dtype=np.int64)
    if world <= 1:
        return np.zeros(len(ids), np.int64)
    salts = np.asarray([table_salt(f) ^ _OWNER_SALT for f in fields], dtype=np.uint64)[field_of]
    return (splitmix64(ids.view(np.uint64) ^ salts) % np.uint64(world)).astype(np.int64)


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

    order: np.ndarray  # local unique ids (all tables concatenated) -> position sorted by (owner, table)
    sizes: list[int]  # per table, how many unique ids this rank has
    send: np.ndarray  # [world, tables]: ids sent to each rank, per table
    recv: np.ndarray  # [world, tables]: ids received from each rank, per table
    field: np.ndarray  # the table index of each local unique id (concatenated order)
    rfield: np.ndarray  # the table index of each received id (received order)
    owned_ids: np.ndarray  # the distinct (table, id) this rank owns and was asked for, by table then id
    owned_bounds: np.ndarray  # table ti's owned ids: owned_ids[owned_bounds[ti]:owned_bounds[ti + 1]]
    inverse: np.ndarray  # each received id -> its position in owned_ids
    batch_sizes: np.ndarray  # every rank's events in this step


class RowExchange:
    """Fetch rows from, and return row gradients to, their owner ranks.

    ``tables`` is ``{table: dim}`` (each table once, at its own row width), or a list of table names
    that all have width ``dim``. Keyed by TABLE: a table shared by several fields is one entry, its
    unique ids over all of them. ``lookup(table, unique_ids) -> Tensor`` and
    ``apply_gradients(table, unique_ids, grads)``
    are the rank's own store (tiered: its hot rows on the device, cold ones in its RocksDB
    shard). Every rank of the group must call :meth:`fetch` and :meth:`give_back` the same
    number of times, in the same order, even with nothing to send (an idle rank joins
    with an empty batch): they are collectives. ``bytes_sent`` counts this rank's payload
    (what leaves it for other ranks). ``precision`` is the wire format of rows and row
    gradients (module docstring); every rank of a group must use the same.

    Ids of every table travel in one ``all_to_all``; rows and gradients in one per distinct row
    width (tables of one width share it), so with one width for every table a step costs exactly
    one collective for ids, one for rows and one for gradients.
    """

    def __init__(self, tables: Sequence[str] | Mapping[str, int], dim: int | None, lookup: Callable,
                 apply_gradients: Callable, rank: int, world: int, group=None,
                 comm_device: torch.device | str = "cpu", precision: str = "fp32", note: Callable | None = None):
        if precision not in PRECISIONS:
            raise ValueError(f"exchange precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.precision = precision
        if isinstance(tables, Mapping):
            dims = {str(t): int(d) for t, d in tables.items()}
        else:
            if dim is None:
                raise ValueError("RowExchange: a list of tables needs their dim")
            dims = {str(t): int(dim) for t in tables}
        self.tables = list(dims)
        self.dims = dims
        self.fields = self.tables  # the name the exchange's callers knew it by: one entry per table
        # tables grouped by row width: one rows/gradients collective per width, tables in their order
        widths = list(dict.fromkeys(dims.values()))
        self._width_of = np.array([widths.index(dims[t]) for t in self.tables], dtype=np.int64)
        self._widths = widths
        self.lookup = lookup
        self.apply_gradients = apply_gradients
        # note(table, owned unique ids, occurrences in the group's step), called before each owner's lookup when
        # the store admits ids by frequency: the requesters send their ids' occurrences along
        self.note = note
        self.rank, self.world = int(rank), int(world)
        self.group = group
        self.comm = torch.device(comm_device)  # where collective buffers live: cpu for gloo, the GPU for NCCL
        self.bytes_sent = 0
        self.remote_ids_sent = 0  # ids this rank asked other ranks for (each: an id out, a row back, a gradient out)
        self._route: _Route | None = None

    @property
    def dim(self) -> int:
        """The one row width of every table (a group whose tables differ in width has no single one)."""
        if len(self._widths) != 1:
            raise AttributeError("the tables have several row widths: see RowExchange.dims")
        return self._widths[0]

    def _a2a(self, send: torch.Tensor, recv_rows: list[int], send_rows: list[int]) -> torch.Tensor:
        out = torch.empty((sum(recv_rows),) + tuple(send.shape[1:]), dtype=send.dtype, device=self.comm)
        dist.all_to_all_single(out, send.to(self.comm).contiguous(), output_split_sizes=recv_rows, input_split_sizes=send_rows,
                               group=self.group)
        row_bytes = send.element_size() * (int(np.prod(send.shape[1:])) if send.dim() > 1 else 1)
        self.bytes_sent += (sum(send_rows) - send_rows[self.rank]) * row_bytes  # what leaves this rank
        return out

    def _class_parts(self, r: _Route, c: int):
        """For width class ``c``: the positions (in send order) of the local ids, the received positions,
        per-rank send/receive counts, and the class-local index of each owned id and each local id."""
        in_c = self._width_of == c
        send_pos = r.order[in_c[r.field[r.order]]]  # local concatenated positions, by (owner, table)
        recv_pos = np.flatnonzero(in_c[r.rfield])  # received ids of this class, in received order
        send = r.send[:, in_c].sum(1).tolist()
        recv = r.recv[:, in_c].sum(1).tolist()
        owned_c = np.full(len(r.owned_ids), -1, np.int64)
        b = r.owned_bounds
        n_owned = 0
        for ti in np.flatnonzero(in_c):
            k = int(b[ti + 1] - b[ti])
            owned_c[b[ti]:b[ti + 1]] = np.arange(n_owned, n_owned + k)
            n_owned += k
        local_c = np.cumsum(in_c[r.field]) - 1  # class-local index of each local id (valid where in class)
        return in_c, send_pos, recv_pos, send, recv, owned_c, n_owned, local_c

    def fetch(self, uniques: Mapping[str, np.ndarray], batch_size: int,
              occurrences: Mapping[str, np.ndarray] | None = None) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        """Rows for this rank's unique ids of every table; and every rank's batch size this step.
        ``occurrences``: each unique id's occurrences in this rank's batch, summed per id at its owner and handed to
        ``note`` (the exchange was built with one); one more all-to-all of the ids' size.

        Every table is handled in whole-step numpy/torch ops (one hash for the owners, one sort for the
        distinct ids asked of this rank, one gather of the rows per width); only the store is called per table."""
        W, F = self.world, len(self.tables)
        ids_all = [np.asarray(uniques[f], dtype=np.int64) for f in self.tables]
        sizes = [len(u) for u in ids_all]
        ids = np.concatenate(ids_all) if ids_all else np.zeros(0, np.int64)
        field = np.repeat(np.arange(F, dtype=np.int64), sizes)
        owner = owners_of_fields(self.tables, ids, field, W)
        order = np.lexsort((field, owner))  # by owner, then table; stable within a table
        # the counts message: per destination, ids per table, then this rank's batch size and whether all its
        # ids fit int32 (so every rank learns every rank's batch size and the step's id width in one message)
        counts = np.zeros((W, F + 2), np.int64)
        counts[:, :F] = np.bincount(owner * F + field, minlength=W * F).reshape(W, F)
        counts[:, F] = batch_size
        counts[:, F + 1] = int(not len(ids) or (int(ids.min()) >= _I32.min and int(ids.max()) <= _I32.max))
        if int(counts.max()) > _I32.max:
            raise ValueError(f"rank {self.rank}: a step of {batch_size} events is beyond the counts message's int32")
        got = torch.empty(W * (F + 2), dtype=torch.int32, device=self.comm)
        dist.all_to_all_single(got, torch.from_numpy(counts.reshape(-1).astype(np.int32)).to(self.comm),
                               group=self.group)
        self.bytes_sent += (W - 1) * (F + 2) * 4
        got = got.cpu().numpy().astype(np.int64).reshape(W, F + 2)
        batch_sizes = got[:, F].copy()
        narrow = bool(got[:, F + 1].all())  # every rank's ids fit: all send int32 (a2a needs one dtype)
        recv_counts = got[:, :F]
        send = counts[:, :F].sum(1).tolist()
        recv = recv_counts.sum(1).tolist()
        out_ids = ids[order].astype(np.int32) if narrow else ids[order]
        rids = self._a2a(torch.from_numpy(out_ids), recv, send).cpu().numpy().astype(np.int64, copy=False)
        self.remote_ids_sent += sum(send) - send[self.rank]
        # received ids are grouped by source rank, then table: label each with its table, then one sort by
        # (table, id) gives every table's distinct ids (one read per row, however many ranks ask)
        rfield = np.repeat(np.tile(np.arange(F, dtype=np.int64), W), recv_counts.reshape(-1))
        by = np.lexsort((rids, rfield))
        sf, sid = rfield[by], rids[by]
        first = np.ones(len(by), bool)
        first[1:] = (sf[1:] != sf[:-1]) | (sid[1:] != sid[:-1])
        owned_ids = sid[first]
        bounds = np.searchsorted(sf[first], np.arange(F + 1))
        inverse = np.empty(len(by), np.int64)
        inverse[by] = np.cumsum(first) - 1
        if self.note is not None:
            occ = (np.concatenate([np.asarray(occurrences[f], np.int64) for f in self.tables]) if occurrences
                   else np.ones(len(ids), np.int64))
            rocc = self._a2a(torch.from_numpy(occ[order].astype(np.int32)), recv, send).cpu().numpy()
            owned_occ = np.zeros(len(owned_ids), np.int64)
            np.add.at(owned_occ, inverse, rocc.astype(np.int64))
            for ti in range(F):
                if bounds[ti + 1] > bounds[ti]:
                    self.note(self.tables[ti], owned_ids[bounds[ti]:bounds[ti + 1]],
                              owned_occ[bounds[ti]:bounds[ti + 1]])
        r = _Route(order, sizes, counts[:, :F], recv_counts, field, rfield, owned_ids, bounds, inverse, batch_sizes)
        out: dict[str, torch.Tensor] = {}
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        for c, d in enumerate(self._widths):
            in_c, send_pos, recv_pos, c_send, c_recv, owned_c, n_owned, local_c = self._class_parts(r, c)
            parts = [self.lookup(self.tables[ti], owned_ids[bounds[ti]:bounds[ti + 1]]).detach().to(self.comm, torch.float32)
                     for ti in np.flatnonzero(in_c) if bounds[ti + 1] > bounds[ti]]
            rows_u = torch.cat(parts) if parts else torch.zeros((0, d), device=self.comm)
            rows_out = rows_u[torch.from_numpy(owned_c[inverse[recv_pos]]).to(self.comm)]
            back = decode_rows(self._a2a(encode_rows(rows_out, self.precision), c_send, c_recv), self.precision)
            mine = torch.empty((int(in_c[field].sum()), d), dtype=back.dtype, device=self.comm)
            mine[torch.from_numpy(local_c[send_pos]).to(self.comm)] = back
            for ti in np.flatnonzero(in_c):
                at = int(local_c[starts[ti]]) if sizes[ti] else 0
                out[self.tables[ti]] = mine[at:at + sizes[ti]]
        self._route = r
        return out, batch_sizes

    def give_back(self, grads: Mapping[str, torch.Tensor | None]) -> None:
        """Send the row gradients of the last :meth:`fetch` to their owners, who sum and apply them.
        A refused step (not finite anywhere in the group) skips this on every rank."""
        r = self._route
        if r is None:
            raise RuntimeError("give_back without a fetch")
        self._route = None
        for c, d in enumerate(self._widths):
            in_c, send_pos, recv_pos, c_send, c_recv, owned_c, n_owned, local_c = self._class_parts(r, c)
            parts = []
            for ti in np.flatnonzero(in_c):
                n, g = r.sizes[ti], grads.get(self.tables[ti])
                parts.append(torch.zeros((n, d), device=self.comm) if g is None
                             else g.detach().to(self.comm, torch.float32).reshape(n, d))
            g_all = torch.cat(parts) if parts else torch.zeros((0, d), device=self.comm)
            wire = encode_rows(g_all[torch.from_numpy(local_c[send_pos]).to(self.comm)], self.precision)
            got = decode_rows(self._a2a(wire, c_recv, c_send), self.precision)
            if not n_owned:
                continue
            # every rank's contribution to a row summed in one op (in the order they arrived, so the sum is
            # the same on every run), then applied once per table
            summed = torch.zeros((n_owned, d), dtype=torch.float32, device=self.comm)
            summed.index_add_(0, torch.from_numpy(owned_c[r.inverse[recv_pos]]).to(self.comm), got)
            b = r.owned_bounds
            for ti in np.flatnonzero(in_c):
                if b[ti + 1] > b[ti]:
                    lo = int(owned_c[b[ti]])
                    self.apply_gradients(self.tables[ti], r.owned_ids[b[ti]:b[ti + 1]],
                                         summed[lo:lo + int(b[ti + 1] - b[ti])])
