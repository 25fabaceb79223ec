"""Receive a PushSnapshot stream into a private staging directory, checking as it goes.

Nothing here touches the served version: files land in ``staging/<random>/``,
each file's bytes must arrive in order, and at the end every file's size and
sha256 must match the manifest. Any failure removes the staging directory.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterable, Iterator

from streamrec.snapshot import MANIFEST, Manifest, SnapshotError


OPEN_FILES = 16  # files of one push open at once: a stream that interleaves many files reopens them (append)


def parse_chunks(raw: Iterable[bytes]) -> Iterator:
    """``SnapshotChunk`` messages from the raw bytes of a PushSnapshot stream: bytes that are not one
    are refused as INVALID_ARGUMENT naming the message (gRPC's own decoding answers INTERNAL)."""
    from .pb import pb

    for i, blob in enumerate(raw):
        try:
            yield pb.SnapshotChunk.FromString(blob)
        except Exception:  # DecodeError, or whatever the protobuf runtime raises on garbage
            raise SnapshotError(f"message {i} of the stream is not a SnapshotChunk (malformed protobuf)",
                                code="INVALID_ARGUMENT") from None


def receive_snapshot(chunks: Iterable, staging_root: Path, max_bytes: int,
                     precheck: Callable[[Manifest], None] | None = None) -> tuple[Path, Manifest]:
    """Consume ``SnapshotChunk`` messages; return the verified staging dir and manifest.

    ``precheck(manifest)`` runs right after the manifest arrives (e.g. the parent
    check) so a doomed push is refused before its bytes are sent.
    """
    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("part") != "manifest_json":
        raise SnapshotError("manifest_json: the first message of PushSnapshot must carry the manifest", code="INVALID_ARGUMENT")
    try:
        manifest = Manifest.from_json(first.manifest_json)
    except SnapshotError as e:
        raise SnapshotError(f"manifest_json: {e}", code="INVALID_ARGUMENT") from None
    total = sum(f["bytes"] for f in manifest.files.values())
    if total > max_bytes:
        raise SnapshotError(f"manifest_json: snapshot of {total} bytes exceeds serving.max_snapshot_mb "
                            f"({max_bytes} bytes)", code="INVALID_ARGUMENT")
    if precheck is not None:
        precheck(manifest)
    stage = Path(staging_root) / f"{manifest.version}-{uuid.uuid4().hex[:8]}"
    stage.mkdir(parents=True)
    ok = False
    handles: dict = {}
    try:
        hashes = {n: hashlib.sha256() for n in manifest.files}
        got = {n: 0 for n in manifest.files}
        for msg in it:
            if msg.WhichOneof("part") != "chunk":
                raise SnapshotError("manifest_json: sent twice; only the first message carries it", code="INVALID_ARGUMENT")
            c = msg.chunk
            if c.name not in manifest.files:
                raise SnapshotError(f"chunk.name: {c.name!r} is not a file of the manifest", code="INVALID_ARGUMENT")
            if c.offset != got[c.name]:
                raise SnapshotError(f"chunk.offset: {c.name} at {c.offset}, expected {got[c.name]} (lost or reordered chunk)", code="DATA_LOSS")
            if got[c.name] + len(c.data) > manifest.files[c.name]["bytes"]:
                raise SnapshotError(f"{c.name}: more bytes than the manifest's {manifest.files[c.name]['bytes']}", code="DATA_LOSS")
            f = handles.pop(c.name, None)  # re-inserted last: the dict's order is least recently used first
            if f is None:
                if len(handles) >= OPEN_FILES:
                    handles.pop(next(iter(handles))).close()
                f = open(stage / c.name, "ab")  # a new file, or one closed above: its bytes so far stay
            handles[c.name] = f
            f.write(c.data)
            hashes[c.name].update(c.data)
            got[c.name] += len(c.data)
        for f in handles.values():
            f.close()
        handles.clear()
        for name, info in manifest.files.items():
            if got[name] != info["bytes"]:
                raise SnapshotError(f"{name}: received {got[name]} of {info['bytes']} bytes (truncated stream)", code="DATA_LOSS")
            if hashes[name].hexdigest() != info["sha256"]:
                raise SnapshotError(f"{name}: sha256 does not match the manifest (corrupt)", code="DATA_LOSS")
            if info["bytes"] == 0:
                (stage / name).touch()
        (stage / MANIFEST).write_bytes(first.manifest_json)
        ok = True
        return stage, manifest
    finally:
        for f in handles.values():
            try:
                f.close()
            except OSError:  # a full disk fails the flush too: the staged files are removed below all the same
                if ok:
                    raise
        if not ok:
            shutil.rmtree(stage, ignore_errors=True)
