"""The model both the trainer and serving run, and the batch-to-tensor glue around it.

Public surface::

    RankingModel, ModelBuilder        # the extension point (model_types.py)
    Architecture                      # model.architecture's values (a Literal alias)
    build_model(model_cfg, probe=True)  # the one builder: model.module (a user's), else model.architecture
    load_builder("pkg.mod:build")     # a user's ModelBuilder by import path
    ModelModuleError                  # model.module gives no usable model; .stage: import | build | probe
    DLRM, DCNv2, DeepFM, MLPRanker    # the built-in architectures (one module each)
    mlp                               # a ReLU MLP of given sizes
    embed_batch, pool_sum, unique_ids, predict_batch   # batch -> tensors -> scores (per table, [B, T])
    task_logits, field_tables                          # a model's output as [B, T]; {field: table}

``streamrec.model.references`` holds the independent plain-PyTorch references of the built-ins
(``streamrec eval`` and the quality benches compare against them); they import none of this package's
other modules.

Names load on first use (PEP 562): the config imports ``model_types`` for ``Architecture``
without loading torch.
"""

from typing import TYPE_CHECKING

from streamrec.foundation.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .dcn_v2 import DCNv2
    from .deepfm import DeepFM
    from .dlrm import DLRM, embed_batch, field_tables, mlp, pool_sum, predict_batch, task_logits, unique_ids
    from .mlp_model import MLPRanker
    from .model_types import Architecture, ModelBuilder, RankingModel
    from .registry import BUILTINS, ModelModuleError, build_model, load_builder

_EXPORTS = {  # submodule: the public names it defines
    ".dcn_v2": "DCNv2",
    ".deepfm": "DeepFM",
    ".dlrm": "DLRM embed_batch field_tables mlp pool_sum predict_batch task_logits unique_ids",
    ".mlp_model": "MLPRanker",
    ".model_types": "Architecture ModelBuilder RankingModel",
    ".registry": "BUILTINS ModelModuleError build_model load_builder",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()]
