"""Fuzzing the decoder: whatever the bytes, one record either decodes to a valid EventBatch or is
refused with an EventError, never another exception and never a crash. Arbitrary bytes, valid JSON
and Arrow messages with a few bytes flipped, inserted, deleted or overwritten, and JSON events with
hostile values (lone surrogates, huge/NaN/inf dense values, deep nesting, wrong types) go through
``decode`` and ``decode_many``; a child process runs thousands of Arrow mutations to catch a
segmentation fault. Then one plain test per poison class that once stopped the trainer, and one for
a decompression bomb."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrec.ingest import Decoder, EventError, EventSchema, SyntheticStream, encode_arrow, encode_json
from tests.conftest import fuzz_examples, small_config

CFG = small_config(Path("/nonexistent/decoder-fuzz"))  # the paths are never used: decoding only
SCHEMA = EventSchema.from_sections(CFG.model, CFG.ingest)  # fields user, item, tags; dense 3; dense_abs_max 1e9 (the default)
DEC = Decoder(SCHEMA)
# 300 examples a test under the ci profile (a tenth under dev); STREAMREC_FUZZ_EXAMPLES=20000 fuzzes longer
FUZZ = settings(max_examples=fuzz_examples(300), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _batch(n: int = 16):
    b = next(SyntheticStream(CFG, chunk=n).batches(n))
    b.request_ids = [f"req-{i}" if i % 3 else None for i in range(n)]
    return b


def _compressed(batch, codec: str) -> bytes:
    from streamrec.ingest.codec import batch_to_arrow

    rb = batch_to_arrow(batch, SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema, options=pa.ipc.IpcWriteOptions(compression=codec)) as w:
        w.write_batch(rb)
    return sink.getvalue().to_pybytes()


BATCH = _batch()
ARROW_SEEDS = [encode_arrow(BATCH.take(np.arange(k)), SCHEMA) for k in (1, 3, 16)] + [
    _compressed(BATCH, "zstd"), _compressed(BATCH.take(np.arange(3)), "lz4")]
JSON_SEEDS = [encode_json(ev) for ev in BATCH.take(np.arange(4)).to_events()] + [
    json.dumps({"ts": 5, "label": 0.5, "dense": [1.5, -2, 0], "user": "alice", "item": 2**64 - 1,
                "sparse": {"tags": ["a", "ü", 3]}, "request_id": "r-1"}).encode(),
]


# -- the property ---------------------------------------------------------------


def check_batch(b) -> None:
    """The invariants of a decoded batch: what the trainer and the sketch rely on."""
    n = len(b)
    assert b.ts.dtype == np.int64 and b.ts.shape == (n,)
    assert b.labels.dtype == np.float32 and b.labels.shape == (n,)
    assert np.all((b.labels >= 0) & (b.labels <= 1))  # NaN fails
    assert b.dense.dtype == np.float32 and b.dense.shape == (n, SCHEMA.dense_dim)
    assert np.all(np.abs(b.dense) <= SCHEMA.dense_abs_max)  # finite and within the bound (NaN fails)
    assert list(b.sparse) == list(SCHEMA.fields)
    for f, j in b.sparse.items():
        assert j.values.dtype == np.int64 and j.offsets.dtype == np.int64, f
        assert len(j.offsets) == n + 1 and j.offsets[0] == 0 and j.offsets[-1] == len(j.values), f
        assert np.all(np.diff(j.offsets) >= 0), f
    if b.request_ids is not None:
        assert len(b.request_ids) == n
        for r in b.request_ids:
            assert r is None or (isinstance(r, str) and r.encode("utf-8") is not None)


def decode_one(value):
    """The decoded batch (checked), or None when refused with an EventError; anything else fails the test."""
    try:
        b = DEC.decode(value)
    except EventError as e:
        assert str(e)  # a reason, always
        return None
    check_batch(b)
    return b


def decode_many_agrees(values) -> None:
    """decode_many never raises, reports exactly the records decode refuses, and keeps the others in order."""
    singles = [decode_one(v) for v in values]
    batch, errors = DEC.decode_many(values)
    assert [i for i, _ in errors] == [i for i, s in enumerate(singles) if s is None]
    assert all(isinstance(r, str) and r for _, r in errors)
    good = [s for s in singles if s is not None]
    if not any(len(s) for s in good):
        assert batch is None or len(batch) == 0
        return
    check_batch(batch)
    assert batch.to_events() == [ev for s in good for ev in s.to_events()]


# -- strategies -----------------------------------------------------------------

MUTATIONS = st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "overwrite", "truncate"]),
                               st.integers(0, 2**20), st.integers(0, 255)), min_size=1, max_size=4)


def mutate(value: bytes, ops) -> bytes:
    v = bytearray(value)
    for op, at, byte in ops:
        if not v:
            break
        i = at % len(v)
        if op == "flip":
            v[i] ^= 1 << (byte % 8)
        elif op == "insert":
            v.insert(i, byte)
        elif op == "delete":
            del v[i]
        elif op == "overwrite":
            v[i] = byte
        else:
            del v[i:]
    return bytes(v)


def _hostile_leaves():
    return st.one_of(
        st.none(), st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([3e38, -3e38, 1e9, 1e9 + 1, 1.7e308, 2**63, 2**64, -(2**63) - 1]),
        st.text(max_size=8),
        st.sampled_from(["\ud800", "a\udfffb", "\udbff\udc00x", "ü", "", "\x00"]),
    )


HOSTILE = st.recursive(_hostile_leaves(), lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=12)


@st.composite
def hostile_events(draw):
    """A JSON event of the right shape with some of its values replaced by hostile ones."""
    ev = {"ts": draw(st.integers(0, 2**40)), "label": draw(st.sampled_from([0, 1, 0.25])),
          "dense": draw(st.lists(st.floats(-10, 10), min_size=3, max_size=3)),
          "sparse": {"user": draw(st.integers(0, 99)), "tags": ["a", 2]}}
    for key in draw(st.lists(st.sampled_from(
            ["ts", "label", "dense", "dense[]", "sparse", "user", "item", "tags[]", "request_id", "extra"]),
            max_size=3)):
        value = draw(HOSTILE)
        sparse = ev.get("sparse") if isinstance(ev.get("sparse"), dict) else None
        if key == "dense[]" and isinstance(ev["dense"], list) and ev["dense"]:
            ev["dense"][draw(st.integers(0, len(ev["dense"]) - 1))] = value
        elif key == "tags[]" and sparse is not None and isinstance(sparse.get("tags"), list):
            sparse["tags"].append(value)
        elif key in ("user", "item") and sparse is not None and draw(st.booleans()):
            sparse[key] = value  # the id in sparse, else a top-level "user"/"item" key
        elif not key.endswith("[]"):
            ev[key] = value
    return ev


def _json_bytes(ev, how: str) -> bytes:
    if how == "ascii":  # lone surrogates as "\ud800" escapes
        return json.dumps(ev).encode()
    # as raw UTF-8 bytes: a lone surrogate becomes ED A0 80 (what other languages' encoders can emit)
    return json.dumps(ev, ensure_ascii=False).encode("utf-8", "surrogatepass")


# -- the fuzz tests ---------------------------------------------------------------


@FUZZ
@given(st.one_of(st.binary(max_size=600),
                 st.binary(max_size=400).map(lambda b: b"{" + b),
                 st.binary(max_size=400).map(lambda b: b"\xff\xff\xff\xff" + b)))
def test_arbitrary_bytes_decode_or_are_refused(value):
    decode_one(value)


@FUZZ
@given(st.sampled_from(ARROW_SEEDS), MUTATIONS)
def test_mutated_arrow_messages_decode_or_are_refused(seed, ops):
    decode_one(mutate(seed, ops))


@FUZZ
@given(st.sampled_from(JSON_SEEDS), MUTATIONS)
def test_mutated_json_messages_decode_or_are_refused(seed, ops):
    decode_one(mutate(seed, ops))


@FUZZ
@given(hostile_events(), st.sampled_from(["ascii", "utf8"]))
def test_hostile_json_events_decode_or_are_refused(ev, how):
    b = decode_one(_json_bytes(ev, how))
    if b is not None:  # accepted: then its dense values were finite numbers within the bound
        assert all(isinstance(x, (int, float)) and math.isfinite(x) and abs(x) <= 1e9 for x in ev["dense"])


@FUZZ
@given(st.integers(1, 20_000), st.sampled_from(["[", "{\"a\":"]), st.sampled_from(["label", "dense", "request_id"]))
def test_deeply_nested_json_is_refused(depth, opener, key):
    closer = "]" if opener == "[" else "}"
    raw = '{"label": 1, "dense": [0, 0, 0], "%s": %s0%s}' % (key, opener * depth, closer * depth)
    assert decode_one(raw.encode()) is None


@FUZZ
@given(st.lists(st.one_of(
    st.sampled_from(ARROW_SEEDS + JSON_SEEDS),
    st.tuples(st.sampled_from(ARROW_SEEDS + JSON_SEEDS), MUTATIONS).map(lambda t: mutate(*t)),
    hostile_events().map(lambda ev: _json_bytes(ev, "ascii")),
    st.binary(max_size=64), st.none()), min_size=1, max_size=8))
def test_decode_many_reports_exactly_the_bad_records(values):
    decode_many_agrees(values)


@pytest.mark.subprocess
def test_thousands_of_arrow_mutations_never_crash_the_process():
    """A segmentation fault cannot be caught in-process: a child decodes a message crafted to make the
    old decoder read outside a buffer, then 10,000 Arrow mutations, and must exit 0."""
    seed = int.from_bytes(np.random.default_rng().bytes(4), "little")
    code = textwrap.dedent(f"""
        import faulthandler, random, sys
        faulthandler.enable()
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.ingest.test_decoder_fuzz import ARROW_SEEDS, DEC, EventError, check_batch, crafted_string_offsets
        try:  # a null row, then a string starting 16 MiB before its buffer: a segfault in the old decoder
            DEC.decode(crafted_string_offsets((0, -(1 << 24), 5, 10)))
            sys.exit("crafted offsets decoded")
        except EventError:
            pass
        rng = random.Random({seed})
        ops = ("flip", "insert", "delete", "overwrite", "truncate")
        for k in range(10_000):
            v = bytearray(rng.choice(ARROW_SEEDS))
            for _ in range(rng.randint(1, 4)):
                op, i = rng.choice(ops), rng.randrange(len(v))
                if op == "flip": v[i] ^= 1 << rng.randrange(8)
                elif op == "insert": v.insert(i, rng.randrange(256))
                elif op == "delete" and len(v) > 1: del v[i]
                elif op == "overwrite": v[i] = rng.choice((0, 0x7F, 0x80, 0xFF, rng.randrange(256)))
                elif op == "truncate" and i: del v[i:]
            try:
                check_batch(DEC.decode(bytes(v)))
            except EventError:
                pass
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (
        f"seed {seed}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


# -- one plain test per poison class ------------------------------------------------


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _cols(n: int = 2) -> dict:
    return {"label": pa.array([1.0] * n, pa.float32()), "dense": pa.array([[0.0, 1.0, 2.0]] * n, pa.list_(pa.float32(), 3))}


def crafted_string_offsets(offsets) -> bytes:
    """A valid Arrow message whose request_id offsets ([None, "abcde", "fghij"]: 0, 0, 5, 10) are
    overwritten with ``offsets``: what a reader that trusts them turns into reads outside the buffer."""
    m = _ipc(pa.table({"label": pa.array([1.0] * 3, pa.float32()),
                       "dense": pa.array([[0.0, 1.0, 2.0]] * 3, pa.list_(pa.float32(), 3)),
                       "request_id": pa.array([None, "abcde", "fghij"])}))
    valid = b"".join(x.to_bytes(4, "little") for x in (0, 0, 5, 10))
    assert m.count(valid) == 1
    return m.replace(valid, b"".join(x.to_bytes(4, "little", signed=True) for x in offsets))


def _refused(value) -> str:
    with pytest.raises(EventError) as e:
        DEC.decode(value)
    _, errors = DEC.decode_many([encode_json(BATCH.to_events()[0]), value])
    assert [i for i, _ in errors] == [1] and errors[0][1] == str(e.value)
    return str(e.value)


def test_arrow_duplicate_column_is_refused():
    t = pa.Table.from_arrays([*_cols().values(), pa.array([[1], [2]]), pa.array([[3], [4]])],
                             names=["label", "dense", "user", "user"])
    assert _refused(_ipc(t)) == "duplicate column 'user'"


@pytest.mark.parametrize("raw", [b"\xff", b"\xed\xa0\x80", b"ok\xc3"], ids=["ff", "surrogate", "truncated"])
def test_arrow_invalid_utf8_string_column_is_refused(raw):
    rids = pa.array([b"fine", raw], pa.binary()).view(pa.string())  # no check on the way in
    reason = _refused(_ipc(pa.table({**_cols(), "request_id": rids})))
    assert "'request_id'" in reason and "invalid UTF-8" in reason


@pytest.mark.parametrize("where", ["user", "tags", "request_id", "item"])
@pytest.mark.parametrize("form", ["ED A0 80 bytes", "\\ud800 escape"])
def test_json_lone_surrogate_in_a_string_is_refused(where, form):
    s = "\ud800" if where != "tags" else "a\udfff"
    ev = {"ts": 1, "label": 1, "dense": [0, 0, 0], "sparse": {"tags": ["x"]}}
    if where == "tags":
        ev["sparse"]["tags"].append(s)
    elif where == "item":
        ev["item"] = s
    else:
        ev[where] = s
    raw = _json_bytes(ev, "utf8" if form.startswith("ED") else "ascii")
    assert (b"\xed" in raw) == form.startswith("ED")
    reason = _refused(raw)
    # the standard json module makes a lone surrogate of both forms; orjson refuses the JSON itself
    assert "lone surrogate" in reason or reason.startswith("bad JSON"), reason


@pytest.mark.parametrize("x", [3e38, -3e38, 1e9 * 1.5, float("inf"), float("nan")])
def test_dense_beyond_the_bound_is_refused_in_json_and_arrow(x):
    js = json.dumps({"ts": 1, "label": 1, "dense": [0, x, 0]}).encode()
    reason = _refused(js)  # orjson refuses the NaN/Infinity literals as bad JSON, the json module parses them
    assert "ingest.dense_abs_max" in reason or (not math.isfinite(x) and reason.startswith("bad JSON")), reason
    arrow = _ipc(pa.table({"label": pa.array([1.0, 1.0], pa.float32()),
                           "dense": pa.array([[0.0, 1.0, 2.0], [0.0, x, 0.0]], pa.list_(pa.float32(), 3))}))
    reason = _refused(arrow)
    assert "finite" in reason and "ingest.dense_abs_max" in reason and "(row 1)" in reason, reason


@pytest.mark.parametrize("offsets", [(0, 0, 5, 1 << 30), (0, -5, 5, 10), (0, 0, 12, 10)],
                         ids=["beyond the data", "negative", "decreasing"])
def test_arrow_string_offsets_out_of_bounds_are_refused(offsets):
    """Before the full validation these raised ArrowIndexError or SystemError out of the decoder (and one
    more, in the subprocess test below, a segmentation fault)."""
    reason = _refused(crafted_string_offsets(offsets))
    assert reason.startswith("bad Arrow IPC stream: column 'request_id'") and "offset" in reason, reason


def test_compressed_arrow_decodes_and_a_decompression_bomb_is_refused():
    """LZ4/ZSTD record batches decode as the plain ones do; one whose buffers would decompress to far
    more than the message (zeros compress ~30,000:1) is refused before anything is decompressed."""
    assert DEC.decode(ARROW_SEEDS[3]).to_events() == BATCH.to_events()
    assert DEC.decode(ARROW_SEEDS[4]).to_events() == BATCH.take(np.arange(3)).to_events()
    n = 4_000_000
    zeros = pa.table({"ts": pa.array(np.zeros(n, np.int64)), "label": pa.array(np.zeros(n, np.float32)),
                      "dense": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(3 * n, np.float32)), 3)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, zeros.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(zeros)
    bomb = sink.getvalue().to_pybytes()
    assert len(bomb) < 100_000 and zeros.nbytes > 80_000_000
    assert "would decompress to" in _refused(bomb)


def test_the_dense_bound_is_the_configured_one():
    wide = Decoder(EventSchema(SCHEMA.fields, SCHEMA.dense_dim, dense_abs_max=3.3e38))
    arrow = _ipc(pa.table({"label": pa.array([1.0], pa.float32()),
                           "dense": pa.array([[0.0, 3e38, 0.0]], pa.list_(pa.float32(), 3))}))
    assert wide.decode(arrow).dense[0, 1] == np.float32(3e38)
    assert wide.decode(json.dumps({"label": 1, "dense": [0, 3e38, 0]}).encode()).dense[0, 1] == np.float32(3e38)


def test_a_failing_batched_step_falls_back_to_record_by_record(monkeypatch):
    """Anything raised while building many records at once (JSON rows into columns, Arrow tables
    joined) is done again record by record: only the record that fails alone is reported, by name
    of the exception's type, and the others arrive."""
    from streamrec.ingest import codec

    build, from_table = EventSchema.batch_from_parsed, codec.Decoder._batch_from_table

    def build_or_fail(self, rows):
        if any(r[0] == 666 for r in rows):
            raise RuntimeError("boom in the batch build")
        return build(self, rows)

    def from_table_or_fail(self, table):
        if 777 in table.column("ts").to_pylist():
            raise IndexError("boom in the table")
        return from_table(self, table)

    monkeypatch.setattr(EventSchema, "batch_from_parsed", build_or_fail)
    monkeypatch.setattr(codec.Decoder, "_batch_from_table", from_table_or_fail)
    ev = BATCH.to_events()[0]
    values = [encode_json({**ev, "ts": t}) for t in (1, 666, 2)]
    values += [_ipc(pa.table({**_cols(1), "ts": pa.array([t])})) for t in (3, 777, 4)]
    batch, errors = DEC.decode_many(values)
    assert [i for i, _ in errors] == [1, 4]
    assert "RuntimeError" in errors[0][1] and "IndexError" in errors[1][1]
    assert batch.ts.tolist() == [1, 2, 3, 4]
    with pytest.raises(EventError, match="RuntimeError"):
        DEC.decode(values[1])
