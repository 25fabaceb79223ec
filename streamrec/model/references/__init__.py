"""Independent plain-PyTorch references of the built-in architectures, written from the papers without
the model's own modules: ``streamrec eval`` and the quality benches compare the trainer against them.

Public surface::

    ReferenceTraining, mini_batches            # the training values a reference copies; its mini-batches
    PlainDLRM, dlrm_progressive                # DLRM (plain_dlrm.py)
    PlainRanker, make_net, load_by_order, ranker_progressive, NAMES   # DCN-v2, DeepFM, MLP (rankers.py)
    auc, logloss, progressive, row_adagrad_    # the references' own metrics, loop and sparse update

Nothing here imports ``streamrec.model``'s other modules, ``streamrec.trainer`` or
``streamrec.embedding_store``: a bug shared by the product's model and the trainer cannot hide in a
reference too. Names load on first use (PEP 562): torch loads only with a reference.
"""

from typing import TYPE_CHECKING

from streamrec.foundation.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .plain_dlrm import PlainDLRM, auc, dlrm_progressive, logloss, progressive, row_adagrad_
    from .rankers import NAMES, PlainRanker, load_by_order, make_net, ranker_progressive
    from .training import ReferenceTraining, mini_batches

_EXPORTS = {  # submodule: the public names it defines
    ".plain_dlrm": "PlainDLRM auc dlrm_progressive logloss progressive row_adagrad_",
    ".rankers": "NAMES PlainRanker load_by_order make_net ranker_progressive",
    ".training": "ReferenceTraining mini_batches",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()]
