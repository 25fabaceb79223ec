"""The foundation every part stands on: the generic config loader and the ``[model]`` schema, the event
contract, ids and hashing, device choice, the hot-tier budget, file checksums and the error root.

It imports no other part of streamrec: each part's config section lives in that part and is loaded by
the generic loader here (``load_sections``); the whole ``Config`` is the application's
(``streamrec.app.config``). Public surface::

    ConfigError, InvalidValue, parse_overrides          # the loader's errors and --set parsing
    ModelConfig, FieldSpec, TaskSpec                    # [model]: fields, tables, tasks (every layer reads it)
    EventBatch, JaggedIds, EventSchema, EventError      # the event contract
    KeyedJaggedIds                                      # every field's ids of a batch in one values/offsets pair
    FEEDBACK_CODES, FEEDBACK_NAMES, feedback_code       # an event's feedback kind <-> its int8 code
    hash_id, hash_ids, table_salt, splitmix64, salted_mix, INT64_MIN, INT64_MAX
    resolve_device(name)                                # "auto" -> cuda if present, else cpu
    HotConfig, hot_budget(hot, model), hot_budget_rows(hot, model), hot_row_bytes(dim), HotBudget  # [hot]: one rule for all
    sha256_file(path), save_npz(path, arrays), roc_auc(labels, scores), StreamrecError
    auc_se, mean_se, binomial_se, paired_auc           # sampling errors of AUC, a mean, a rate; two models' AUCs paired
    resource_error_line(exc), is_resource_error(exc)   # disk full, read-only, no file handles: one line
    ResourceError, resource_step(what, path), as_resource_error(exc, what, path)
    stop_process(proc, grace)                           # SIGTERM, then SIGKILL after a grace period
    die_with_parent(parent), set_pdeathsig()            # SIGKILL when the parent dies (PR_SET_PDEATHSIG)
    die_with(pid)                                       # SIGKILL when another process exits
"""

from typing import TYPE_CHECKING

from .lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .budget import HotBudget, HotConfig, hot_budget, hot_budget_rows, hot_row_bytes
    from .checksum import sha256_file
    from .config import ConfigError, InvalidValue, parse_overrides
    from .model_config import FieldSpec, ModelConfig, TaskSpec
    from .device import DeviceError, resolve_device
    from .errors import EventError, StreamrecError
    from .events import FEEDBACK_CODES, FEEDBACK_NAMES, FLOAT32_MAX, EventBatch, EventSchema, JaggedIds, feedback_code
    from .keyed_jagged import KeyedJaggedIds
    from .metrics import roc_auc
    from .noise import auc_se, binomial_se, mean_se, paired_auc
    from .ids import INT64_MAX, INT64_MIN, hash_id, hash_ids, salted_mix, splitmix64, table_salt
    from .lazy import lazy_exports
    from .npz import save_npz
    from .processes import die_with, die_with_parent, set_pdeathsig, stop_process
    from .resources import ResourceError, as_resource_error, is_resource_error, resource_error_line, resource_step

# lazy: config readers (the CLI's --help) must not pay for numpy or torch
_EXPORTS = {  # submodule: the public names it defines
    ".budget": "HotBudget HotConfig hot_budget hot_budget_rows hot_row_bytes",
    ".checksum": "sha256_file",
    ".config": "ConfigError InvalidValue parse_overrides",
    ".model_config": "FieldSpec ModelConfig TaskSpec",
    ".device": "DeviceError resolve_device",
    ".errors": "EventError StreamrecError",
    ".events": "FEEDBACK_CODES FEEDBACK_NAMES FLOAT32_MAX EventBatch EventSchema JaggedIds feedback_code",
    ".keyed_jagged": "KeyedJaggedIds",
    ".ids": "INT64_MAX INT64_MIN hash_id hash_ids salted_mix splitmix64 table_salt",
    ".metrics": "roc_auc",
    ".noise": "auc_se binomial_se mean_se paired_auc",
    ".npz": "save_npz",
    ".processes": "die_with die_with_parent set_pdeathsig stop_process",
    ".resources": "ResourceError as_resource_error is_resource_error resource_error_line resource_step",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()] + ["lazy_exports"]
