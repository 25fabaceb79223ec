"""A/B of the embedding store's lookup/apply path: another revision's ``embedding_store`` against the
working tree's, interleaved window by window in one process (so load from elsewhere hits both alike).

    .venv/bin/python benchmarks/ab_store.py [REV]    # REV defaults to HEAD; prints new/old CPU per step

Two workloads: ``bench store``'s (one table, 1 M ids, 4,096 ids a batch, 1% hot, 2% host cache,
frequency admission, prefetch of the next batch) and a trainer-like step (26 tables, lookups of every
table before the gradients of any, as ``TrainerCore`` does).
"""
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_store import BATCH, DIM, _id_stream, _rows_of_ranks  # noqa: E402


def old_package(rev: str) -> str:
    """``embedding_store`` at ``rev``, extracted as the package ``es_old`` under a temporary directory."""
    root = Path(tempfile.mkdtemp(prefix="ab-store-pkg-"))
    pkg = root / "es_old"
    pkg.mkdir()
    names = subprocess.run(["git", "ls-tree", "--name-only", rev, "embedding_store/"], cwd=HERE.parent,
                           check=True, capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith(".py"):
            (pkg / Path(name).name).write_bytes(subprocess.run(["git", "show", f"{rev}:{name}"], cwd=HERE.parent,
                                                               check=True, capture_output=True).stdout)
    return str(root)


def one_table(cls, root, n_ids=1_000_000):
    hot, cache = n_ids // 100, n_ids * 2 // 100
    s = cls(root, {"t": DIM}, shards=4, device="cpu", hot_capacity_rows=hot, block_cache_mb=8, memtable_mb=8,
            host_cache_rows=cache, cache_admission="frequency")
    s.set_hot({"t": _rows_of_ranks(np.arange(hot), n_ids)})
    stream = _id_stream(n_ids, 10**9)
    G = torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(0)) * 0.01
    state = {"ids": next(stream)}
    def step():
        ids = state["ids"]
        uniq, inv = np.unique(ids, return_inverse=True)
        nxt = next(stream)
        s.lookup("t", uniq)
        g = torch.zeros(len(uniq), DIM).index_add_(0, torch.from_numpy(inv), G)
        s.prefetch("t", nxt)
        s.apply_gradients("t", uniq, g)
        state["ids"] = nxt
    return s, step

def many_tables(cls, root, n_ids=200_000, F=26, batch=512):
    tables = {f"f{i}": DIM for i in range(F)}
    hot, cache = n_ids // 100, n_ids * 2 // 100
    s = cls(root, tables, shards=4, device="cpu", hot_capacity_rows=hot * F, block_cache_mb=8, memtable_mb=8,
            host_cache_rows=cache * F, cache_admission="frequency")
    s.set_hot({f: _rows_of_ranks(np.arange(hot), n_ids) for f in tables})
    rng = np.random.default_rng(2)
    from streamrec.ingest.synthetic import zipf_ranks
    def step():
        uq = {}
        for f in tables:
            ids = _rows_of_ranks(zipf_ranks(rng, batch, n_ids, 1.05), n_ids)  # bench store's rank -> row map
            uq[f] = np.unique(ids)
            s.lookup(f, uq[f])
        for f, u in uq.items():
            s.apply_gradients(f, u, torch.full((len(u), DIM), 1e-3))
    return s, step

def ab(make, label, rounds=6, per=30, warm=60):
    roots = {k: tempfile.mkdtemp(prefix=f"ab-store-{k}-") for k in ("old", "new")}
    runs = {"old": make(es_old.EmbeddingStore, roots["old"]), "new": make(New, roots["new"])}
    for k, (s, step) in runs.items():
        for _ in range(warm): step()
    cpu = {"old": [], "new": []}
    for r in range(rounds):
        for k in (("old", "new") if r % 2 == 0 else ("new", "old")):
            s, step = runs[k]
            c0 = time.process_time()
            for _ in range(per): step()
            cpu[k].append((time.process_time() - c0) / per * 1e3)
    for k, (s, _) in runs.items():
        s.close()
        shutil.rmtree(roots[k], ignore_errors=True)
    o, n = np.median(cpu["old"]), np.median(cpu["new"])
    print(f"{label}: ms CPU per step, median of {rounds} windows: old {o:.2f}  new {n:.2f}  new/old {n/o:.3f}  "
          f"(windows old {[round(x,2) for x in cpu['old']]}, new {[round(x,2) for x in cpu['new']]})", flush=True)

def main() -> None:
    global es_old, New
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    sys.path.insert(0, old_package(rev))
    torch.set_num_threads(1)
    import es_old
    from streamrec.embedding_store import EmbeddingStore as New

    print(f"old = embedding_store at {rev}, new = the working tree", flush=True)
    ab(one_table, "bench-store workload (1 table, 1 M ids, 4,096 ids/batch, 1% hot, 2% cache, frequency admission)")
    ab(many_tables, "trainer-like step (26 tables, 200 k ids each, 512 events, lookup all then apply all)")


if __name__ == "__main__":
    main()
