"""streamrec: streaming online learning for recommendation models.

Kafka in, tiered embeddings, gRPC out. The parts are subpackages, in layers that
import only downward (ARCHITECTURE.md draws them)::

    streamrec.app, streamrec.benchmarks        the CLI, demo, report, benchmarks
    streamrec.trainer | streamrec.serving      the two long-running services
    streamrec.model | streamrec.snapshot       DLRM and the trainer-serving contract
    streamrec.sketch | streamrec.embedding_store
    streamrec.ingest                           Kafka I/O, codecs, datasets, broker
    streamrec.foundation                       config, event contract, ids, device, ...

Importing ``streamrec`` itself loads nothing but the version.
"""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("streamrec")
except PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"

__all__ = ["__version__"]
