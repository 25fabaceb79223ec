"""``Decoder.decode_many`` isolating a few bad records in a columnar JSON batch (``Decoder._isolate``).

A batch the columnar path refuses right after one it took is halved until the pieces holding the bad
records are small, and only those go record by record. Whatever the batch holds, the result must be the
record-by-record path's exactly: the same events in the same order (every column, dtype included) and
the same (index, reason) for every bad record -- a bad record is isolated, never drops or changes a good
one -- and for a few bad records in a large batch, only small pieces are decoded record by record.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrec.ingest import Decoder, EventSchema, encode_json
from streamrec.ingest import codec
from tests.conftest import fuzz_examples, small_config
from tests.ingest.test_json_columns import _bytes, _same, events

CFG = small_config(Path("/nonexistent/isolating-decode"))  # fields user, item, tags; dense 3
SCHEMA = EventSchema.from_sections(CFG.model, CFG.ingest)
FUZZ = settings(max_examples=fuzz_examples(100), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])


def _arrow_record() -> bytes:
    sink = pa.BufferOutputStream()
    t = pa.table({"x": [1]})
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


BAD = st.one_of(
    st.sampled_from([b"", None, b"not json", b"{", b'{"ts": 1, "label": 7, "dense": [0, 0, 0]}',
                     b'{"ts": 1, "label": 1, "dense": [0, 0]}', b'{"ts": 1, "label": 1, "dense": [0, 0, 0]}\n',
                     b'{"ts": 1, "label": 1, "dense": [0, 0, 0], "request_id": 7}',  # valid, odd shape
                     b'{"ts": 1, "label": 1, "dense": [0, 0, 0], "sparse": {"user": "s"}}',  # valid, str id
                     _arrow_record()]),
    events().map(_bytes))  # anything the columnar tests draw, valid or not


def _good(i: int, str_ids: bool) -> bytes:
    uid = f"u{i % 7}" if str_ids else i % 7
    return encode_json({"ts": 1_700_000_000_000 + i, "label": float(i % 2), "dense": [0.5, -1.25, float(i)],
                        "sparse": {"user": uid, "item": [i, i + 1], "tags": []}, "request_id": f"r{i}"})


def _expected(values):
    return Decoder(SCHEMA)._decode_records(values)  # the record-by-record path, whole batch


def _check(values, warm: bool):
    dec = Decoder(SCHEMA)
    if warm:  # a batch taken as columns first: the next refused batch is halved
        b, errs = dec.decode_many([_good(i, False) for i in range(64)])
        assert errs == [] and len(b) == 64 and not dec._columns_failed
    got, got_errors = dec.decode_many(values)
    want, want_errors = _expected(values)
    assert got_errors == want_errors
    if want is None:
        assert got is None or len(got) == 0
    else:
        _same(got, want)
    return dec


@FUZZ
@given(n=st.integers(64, 700), str_ids=st.booleans(), bad=st.lists(st.tuples(st.integers(0, 10_000), BAD),
                                                                   max_size=6), warm=st.booleans())
def test_a_few_bad_records_are_isolated_and_the_rest_decoded_as_the_record_path_does(n, str_ids, bad, warm):
    values = [_good(i, str_ids) for i in range(n)]
    for at, v in bad:
        values.insert(at % (len(values) + 1), v)
    _check(values, warm)


# each example draws 64-200 events (most of this file's time): a third of the examples; STREAMREC_FUZZ_EXAMPLES
# raises all of them together for a longer fuzzing run
@settings(FUZZ, max_examples=max(5, FUZZ.max_examples // 3))
@given(evs=st.lists(events(), min_size=64, max_size=200))
def test_any_batch_decodes_as_the_record_path_does(evs):
    """Batches of the columnar tests' events (many refused, many odd shapes): the same result either way."""
    _check([_bytes(e) for e in evs], warm=True)


def test_few_bad_records_go_record_by_record_only_in_small_pieces(monkeypatch):
    """Two bad records in 2,048: the columnar path decodes almost all of it (measured by the records the
    record-by-record path sees), where before the whole batch went record by record."""
    seen = []
    real = Decoder._decode_records

    def counting(self, values):
        seen.append(len(values))
        return real(self, values)

    values = [_good(i, False) for i in range(2048)]
    values[100] = b'{"ts": 1, "label": 7, "dense": [0, 0, 0]}'
    values[1500] = b"not json"
    dec = Decoder(SCHEMA)
    dec.decode_many([_good(i, False) for i in range(64)])
    monkeypatch.setattr(Decoder, "_decode_records", counting)
    got, errors = dec.decode_many(values)
    assert [i for i, _ in errors] == [100, 1500] and len(got) == 2046
    assert 0 < sum(seen) <= 2 * 2 * codec._COLUMNS_MIN, seen
    assert not dec._columns_failed


def test_a_producer_of_another_shape_is_not_halved_again_and_again(monkeypatch):
    """Every record of an odd (valid) shape: halving stops after ``_ISOLATE_FAILURES`` refused pieces, then
    whole batches are tried once each, as before."""
    odd = [encode_json({"ts": i, "label": 1, "dense": [0, 0, 0], "request_id": i}) for i in range(1024)]
    dec = Decoder(SCHEMA)
    dec.decode_many([_good(i, False) for i in range(64)])
    calls = []
    real = Decoder._as_columns
    monkeypatch.setattr(Decoder, "_as_columns", lambda self, v: calls.append(len(v)) or real(self, v))
    got, errors = dec.decode_many(odd)
    assert errors == [] and len(got) == 1024 and dec._columns_failed
    assert len(calls) == 1 + codec._ISOLATE_FAILURES and sum(calls) <= 5 * 1024
    calls.clear()
    for _ in range(3):
        got, errors = dec.decode_many(odd)
        assert errors == [] and len(got) == 1024
    assert calls == [1024, 1024, 1024]
