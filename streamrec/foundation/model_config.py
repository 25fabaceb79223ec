"""``[model]``: the fields, tables and tasks every event and every model shares, and the dense network.

It sits in the foundation because it is the schema every layer reads: the event codecs decode its fields
and tasks, the embedding store sizes its tables from it, serving checks a pushed model against it, and
:func:`model_hash` says when two models are compatible.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .config import InvalidValue, build_section, check_choice

Architecture = Literal["dlrm", "dcn_v2", "deepfm", "mlp"]
"""``model.architecture``: the built-in dense network ``build_model`` makes (``model.module`` names a user's own)."""

GENERATED_FIELD_KEYS = ("cardinality", "zipf", "multi")
"""Keys of the synthetic generator's ``[[generator.fields]]`` that older configs wrote on ``[[model.fields]]``."""

MODEL_HASH_OPTIONAL = {"architecture": "dlrm", "module": "", "cross_layers": 3,
                       "tasks": [{"name": "click", "weight": 1.0}], "params": {}}
"""``[model]`` keys that enter ``model_hash`` only when set away from their default: a DLRM's hash does
not depend on keys that did not exist when its checkpoints were written."""
FIELD_HASH_OPTIONAL = {"dim": 0, "table": ""}
"""``[[model.fields]]`` keys that enter ``model_hash`` only when set away from their default."""

_NAME_RE = r"[A-Za-z_][A-Za-z0-9_]{0,63}"


def _is_name(value: str) -> bool:
    return bool(value) and value.replace("_", "").replace("-", "").isalnum()


@dataclass
class FieldSpec:
    """One sparse field of the model: one embedding table, one or more ids per event."""

    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        k: "belongs to the synthetic generator: set it in [[generator.fields]] (same name), not on [[model.fields]]"
        for k in GENERATED_FIELD_KEYS}

    name: str
    dim: int = 0  # embedding row width of this field's table (0 = model.embedding_dim)
    table: str = ""  # the embedding table this field looks its ids up in ("" = its own table, named as the field); fields naming the same table share its rows and must have the same dim
    expected_ids: int = 0  # distinct ids expected in this table: rows start uniform in +-sqrt(1/expected_ids) (DLRM's rule); 0 = store.init_scale
    init_scale: float = 0.0  # explicit init scale of this table's rows (> 0 overrides expected_ids)

    def __post_init__(self) -> None:
        if not _is_name(self.name):
            raise InvalidValue("name", f"{self.name!r} is not a valid field name")
        if self.dim < 0:
            raise InvalidValue("dim", "must be >= 0 (0 = model.embedding_dim)")
        if self.table and not _is_name(self.table):
            raise InvalidValue("table", f"{self.table!r} is not a valid table name")
        if self.expected_ids < 0:
            raise InvalidValue("expected_ids", "must be >= 0 (0 = use store.init_scale)")
        if not 0 <= self.init_scale <= 1e3:
            raise InvalidValue("init_scale", "must be in [0, 1000] (0 = from expected_ids)")

    def row_init_scale(self, default: float) -> float:
        """Half-width of this table's uniform initial rows: DLRM's ``sqrt(1 / rows)`` from ``expected_ids``."""
        if self.init_scale > 0:
            return float(self.init_scale)
        if self.expected_ids > 0:
            return float((1.0 / self.expected_ids) ** 0.5)
        return float(default)


@dataclass
class TaskSpec:
    """One prediction task of the model: a label name, one logit, one weighted loss term."""

    name: str
    weight: float = 1.0  # weight of this task's masked mean logloss in the training loss

    def __post_init__(self) -> None:
        if not re.fullmatch(_NAME_RE, self.name):
            raise InvalidValue("name", f"{self.name!r} is not a valid task name (letters, digits, _; at most 64)")
        if not (0 < self.weight <= 1e6):
            raise InvalidValue("weight", f"must be in (0, 1e6], got {self.weight!r}")


@dataclass
class ModelConfig:
    fields: list[FieldSpec] = field(
        default_factory=lambda: [FieldSpec("user"), FieldSpec("item"), FieldSpec("category"), FieldSpec("tags")]
    )
    dense_dim: int = 4  # width of the dense feature vector of every event
    embedding_dim: int = 16  # embedding row width (all tables)
    bottom_mlp: list[int] = field(default_factory=lambda: [32, 16])  # bottom MLP layer sizes over dense features (empty: the raw features); dlrm: last = embedding_dim
    top_mlp: list[int] = field(default_factory=lambda: [64, 32])  # top MLP hidden sizes (a 1-unit output layer is added); dcn_v2's deep part, deepfm's deep part, mlp's layers
    seed: int = 0  # seeds embedding initialisation: rows are a function of (table, id, seed); also the dense network's initial weights
    architecture: Architecture = "dlrm"  # the built-in dense network: dlrm (bottom MLP, pairwise dot interaction, top MLP) | dcn_v2 (cross network, then top_mlp) | deepfm (FM + first-order terms + a top_mlp deep part) | mlp (concatenate, then top_mlp)
    module: str = ""  # a user's own model builder as "package.module:function" (called with this section, returns a RankingModel); replaces architecture; must be importable where the trainer runs, and where serving runs when the model cannot be exported ("" = the built-in architecture)
    cross_layers: int = 3  # dcn_v2: full-rank cross layers x_{l+1} = x0 * (W x_l + b) + x_l before the top_mlp deep part (0 = none)
    tasks: list[TaskSpec] = field(default_factory=lambda: [TaskSpec("click")])  # the model's prediction tasks, one logit each, in output order; an event's `label` is the first task's label, `labels` names them
    params: dict[str, Any] = field(default_factory=dict)  # [model.params]: a free-form table of model.module's own settings, passed to its builder as model_cfg.params, which checks them; part of the model hash when set (strings, numbers, booleans, arrays and tables)

    def __post_init__(self) -> None:
        check_choice("model", self, "architecture", Architecture)
        self._check_sizes()
        self._check_tables()
        _check_params(self.params, "params")

    def _check_sizes(self) -> None:
        if not self.fields:
            raise InvalidValue("fields", "at least one sparse field is needed", "model")
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise InvalidValue("fields", f"duplicate field names in {names}", "model")
        if self.dense_dim < 0:
            raise InvalidValue("dense_dim", "must be >= 0", "model")
        if self.embedding_dim <= 0:
            raise InvalidValue("embedding_dim", "must be > 0", "model")
        if (self.architecture == "dlrm" and not self.module and self.bottom_mlp
                and self.bottom_mlp[-1] != self.embedding_dim):
            raise InvalidValue("bottom_mlp", f"last layer must equal embedding_dim ({self.embedding_dim}) for the "
                                             "dot interaction", "model")
        if self.cross_layers < 0:
            raise InvalidValue("cross_layers", "must be >= 0", "model")
        if self.module and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", self.module):
            raise InvalidValue("module", f"{self.module!r} is not an import path of the form "
                                         "'package.module:builder'", "model")
        if not self.tasks:
            raise InvalidValue("tasks", "at least one task is needed", "model")
        task_names = [t.name for t in self.tasks]
        if len(set(task_names)) != len(task_names):
            raise InvalidValue("tasks", f"duplicate task names in {task_names}", "model")

    def _check_tables(self) -> None:
        """Fields sharing a table agree on its width, and a field names a table, not another field's lookup."""
        table_dims: dict[str, tuple[str, int]] = {}
        for f in self.fields:
            t, d = f.table or f.name, f.dim or self.embedding_dim
            if t in table_dims and table_dims[t][1] != d:
                raise InvalidValue("fields", f"fields {table_dims[t][0]!r} and {f.name!r} share table {t!r} but have "
                                             f"dims {table_dims[t][1]} and {d}: a shared table has one row width",
                                   "model")
            table_dims.setdefault(t, (f.name, d))
        own = {f.name for f in self.fields if not f.table or f.table == f.name}
        for f in self.fields:
            if f.table and f.table != f.name and f.table in self.field_names and f.table not in own:
                raise InvalidValue("fields", f"field {f.name!r} names table {f.table!r}, which is a field that looks "
                                             "up another table: name that table instead", "model")

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def task_names(self) -> list[str]:
        """The tasks' names in output order: column ``t`` of the logits is task ``task_names[t]``."""
        return [t.name for t in self.tasks]

    @property
    def field_dims(self) -> dict[str, int]:
        """Per field, in field order, the width of its pooled embedding (its table's row width)."""
        return {f.name: f.dim or self.embedding_dim for f in self.fields}

    @property
    def field_tables(self) -> dict[str, str]:
        """Per field, the embedding table its ids are looked up in."""
        return {f.name: f.table or f.name for f in self.fields}

    @property
    def tables(self) -> dict[str, int]:
        """Every embedding table once, in order of first use, with its row width."""
        out: dict[str, int] = {}
        for f in self.fields:
            out.setdefault(f.table or f.name, f.dim or self.embedding_dim)
        return out

    @property
    def pooled_dim(self) -> int:
        """Width of the model's ``pooled`` input: the field dims summed."""
        return sum(self.field_dims.values())

    def init_scales(self, default: float) -> dict[str, float]:
        """Per table, the half-width of its uniform initial rows (``default``: ``store.init_scale``);
        a shared table takes the first of its fields that sets a scale."""
        out: dict[str, float] = {}
        for f in self.fields:
            t = f.table or f.name
            if t not in out or (out[t] == float(default) and (f.init_scale > 0 or f.expected_ids > 0)):
                out[t] = f.row_init_scale(default)
        return out

    def model_hash(self) -> str:
        """Hash of what makes two models compatible (fields, sizes, seed, tasks, network)."""
        model = dataclasses.asdict(self)
        for key, default in MODEL_HASH_OPTIONAL.items():  # at their defaults they leave an older model's hash as it was
            if model.get(key) == default:
                del model[key]
        for f in model["fields"]:  # per-field keys likewise
            for key, default in FIELD_HASH_OPTIONAL.items():
                if f.get(key) == default:
                    del f[key]
        blob = json.dumps(model, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _check_params(value: Any, key: str) -> None:
    """``[model.params]`` holds what a manifest's JSON and the model hash can carry: string keys; strings,
    booleans, finite numbers, arrays and tables of them."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or not k:
                raise InvalidValue(key, f"has key {k!r}: keys are non-empty strings", "model")
            _check_params(v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_params(v, f"{key}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidValue(key, f"must be finite, got {value!r}", "model")
    elif not isinstance(value, (str, bool, int, float)):
        raise InvalidValue(key, f"is a {type(value).__name__}: a model parameter is a string, boolean, number, "
                                "array or table", "model")


def model_config_from_dict(data: dict) -> ModelConfig:
    """The ``[model]`` section a snapshot or checkpoint wrote as a table, checked as a loaded one is; the
    generator's keys that older configs wrote on ``[[model.fields]]`` are dropped (they never were the model's)."""
    data = dict(data)
    if isinstance(data.get("fields"), list):
        data["fields"] = [{k: v for k, v in f.items() if k not in GENERATED_FIELD_KEYS} if isinstance(f, dict) else f
                          for f in data["fields"]]
    return build_section(ModelConfig, data, "model")
