"""Run a trainer group's ranks as spawned processes (gloo on 127.0.0.1), for tests of the sharded core."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp

from streamrec.foundation import EventBatch
from streamrec.ingest import SyntheticStream, free_port


def synthetic(cfg, n: int) -> EventBatch:
    return EventBatch.concat(list(SyntheticStream(cfg).batches(n)), cfg.model.dense_dim, cfg.model.field_names)


def split(batch: EventBatch, rank: int, world: int) -> EventBatch:
    """Rank ``rank``'s share such that the ranks' k-th mini-batches of ``batch_size // world`` events together
    are exactly one trainer's k-th mini-batch of ``batch_size`` (events i with i % world == rank)."""
    idx = np.arange(len(batch))
    return batch.take(idx[idx % world == rank])


def _rank(rank, world, port, make_cfg, tmp, fn, q):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        q.put((rank, fn(rank, world, make_cfg(Path(tmp)), Path(tmp))))
    except BaseException as e:  # report, do not hang the parent
        q.put((rank, e))
        raise
    finally:
        dist.destroy_process_group()


def run_group(world: int, make_cfg, tmp, fn, timeout: float = 240.0) -> list:
    """``fn(rank, world, cfg, tmp)`` in ``world`` spawned ranks; their results by rank (plain values only)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=_rank, args=(r, world, port, make_cfg, str(tmp), fn, q)) for r in range(world)]
    for p in ps:
        p.start()
    out = {}
    try:
        for _ in ps:
            r, v = q.get(timeout=timeout)
            if isinstance(v, BaseException):
                raise RuntimeError(f"rank {r} failed: {v!r}") from v
            out[r] = v
    finally:
        for p in ps:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world)]


def run_group_scenarios(world: int, make_cfg, tmp, scenarios: dict, timeout: float = 240.0) -> dict[str, list]:
    """Several rank functions (``name -> fn``) in ONE group of ``world`` spawned ranks, one after another, each with
    a config and a directory of its own (``tmp / name``): one spawn and one gloo rendezvous for all of them. Returns
    ``name -> results by rank``. Every scenario must leave the ranks in step (a scenario that ends in an error on
    every rank at the same collective does); put those that end in errors last."""
    fn = functools.partial(_each_scenario, make_cfg, tuple(scenarios.items()))
    ranks = run_group(world, make_cfg, tmp, fn, timeout)
    return {name: [r[name] for r in ranks] for name in scenarios}


def _each_scenario(make_cfg, scenarios, rank, world, _cfg, tmp):
    out = {}
    for name, fn in scenarios:
        sub = Path(tmp) / name
        sub.mkdir(parents=True, exist_ok=True)
        out[name] = fn(rank, world, make_cfg(sub), sub)
    return out


def rank1_config_errors(*cases: tuple[str, object]):
    """A ``run_group`` rank function: for each ``(key, value)`` in turn, rank 1 sets ``trainer.<key> = value``,
    then every rank builds its sharded core and trains one idle window; each rank returns the errors it got
    (``"no error"`` where none), one per case. The cases share one group of processes (a rank's failed check
    fails on every rank at the same collective, so the next case starts in step)."""
    return functools.partial(_rank1_config_errors, cases)


def _rank1_config_errors(cases, rank, world, cfg, tmp):
    import copy

    from streamrec.embedding_store import EmbeddingStore
    from streamrec.foundation import hot_budget
    from streamrec.trainer.sharded_core import ShardedTrainerCore

    out = []
    for i, (key, value) in enumerate(cases):
        c = copy.deepcopy(cfg)
        if rank == 1:
            setattr(c.trainer, key, value)
        store = EmbeddingStore.from_sections(c.store, c.model, hot_budget(c.hot, c.model),
                                             torch.device("cpu"), path=str(tmp / f"store-{i}-{rank}"))
        try:
            ShardedTrainerCore(c.model, c.trainer, store, torch.device("cpu"), rank, world,
                               store_cfg=c.store, join=c.join).train_window(None)
            out.append("no error")
        except RuntimeError as e:
            out.append(str(e))
        finally:
            store.close()
    return out
