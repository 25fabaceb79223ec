"""Where a trainer resumes from: the store and state of the newest checkpoint that verifies and loads.

A checkpoint whose files do not match their checksums, or that fails to load, is set aside
(``corrupt-ckpt-*``) and the previous one is tried; the trainer then re-reads Kafka from that
checkpoint's offsets, so nothing is lost. A resource error (a full or read-only disk) is the machine's
fault, not a corrupt checkpoint: it stops the start and every checkpoint is kept. When every checkpoint
is refused the live store is moved aside (never deleted) and training starts from an empty store.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from streamrec.foundation import StreamrecError, is_resource_error

from .checkpoint import STORE, choose_checkpoint, highest_seq, read_checkpoint, set_aside

if TYPE_CHECKING:
    from .trainer_settings import TrainerSettings

log = logging.getLogger(__name__)


def open_store(settings: TrainerSettings, device, restore_from: Path | None):
    """Open the tiered store; after a crash roll it back to the checkpoint's copy first.

    The hot tier's size comes from the settings (``hot.budget_*``), not the checkpoint's
    manifest: after a raised budget, the hot source's bigger sets must fit the store. The tables are
    the model's (``model.tables``, each once): a checkpoint holding a table at another width is
    refused with a ``StoreMismatchError`` naming it.
    """
    from streamrec.embedding_store import EmbeddingStore, StoreSpec

    spec = StoreSpec.from_sections(settings.store, settings.model, settings.hot_budget, device)
    if restore_from is not None and (restore_from / STORE).exists():
        return EmbeddingStore.restore(str(restore_from / STORE), spec)
    return EmbeddingStore(spec)


def restore_point(open_at: Callable[[Path | None], Any], store_path: str, root: str, refused: list[str],
                  map_location: str = "cpu") -> tuple[Path | None, dict[str, Any], dict[str, Any], Any]:
    """Open the store at the newest checkpoint under ``root`` that verifies and loads:
    ``(dir, state, dense, store)``, or ``(None, {"seq": highest_seq(root)}, {}, a fresh store)`` when there is
    none (a fresh start numbers its checkpoints after every one in use). ``open_at(dir)``
    opens the store at a checkpoint (None: fresh, e.g. :func:`open_store` bound to a config and device);
    ``store_path`` is the live store's (``store.path``); ``map_location`` where tensors load. Each checkpoint
    refused on the way is appended to ``refused`` (``"<dir>: <why>"``)."""
    while True:
        ckpt, skipped = choose_checkpoint(root)
        refused += skipped
        if ckpt is None:
            if refused:
                set_live_store_aside(store_path)
            return None, {"seq": highest_seq(root)}, {}, open_at(None)
        try:
            state, dense = read_checkpoint(ckpt, map_location=map_location)
            if "world" not in state:  # a group's manifest holds no store: its shards are per rank
                return ckpt, state, dense, open_at(ckpt)
        except (StreamrecError, OSError, ValueError, RuntimeError, KeyError) as e:  # torch.load, json, RocksDB
            if is_resource_error(e):  # a full or read-only disk is not a corrupt checkpoint: stop, keep it
                raise
            from streamrec.embedding_store import StoreMismatchError

            if isinstance(e, StoreMismatchError):  # the config's table widths differ: not corruption, keep it
                raise
            why = f"cannot be loaded: {type(e).__name__}: {e}"
            refused.append(f"{ckpt}: {why}")
            set_aside(ckpt, why)
            continue
        raise StreamrecError(f"{ckpt} was written by a trainer group of {state['world']} ranks: resume it with "
                             "`streamrec train --nproc N` (any N; its rows are resharded when N differs)")


def set_live_store_aside(store_path: str) -> None:
    """Every checkpoint was refused: the live store at ``store_path`` (``store.path``) holds rows of events the
    restart will train again (and may share the corrupt file by hard link), so training starts from an empty
    store. The old one is moved aside, not deleted."""
    live = Path(store_path)
    if live.exists():
        aside = live.with_name(f"corrupt-{live.name}-{int(time.time())}")
        live.rename(aside)
        log.error("no checkpoint could be restored: the live store is set aside at %s and training "
                  "starts from an empty store", aside)
