"""A user's own model by import path (``model.module = "pkg.mod:build"``): built, seeded and trained by
TrainerCore; a path that cannot be imported, a builder that returns no ranking model or one that gives
the wrong output shape is one ConfigError line naming ``model.module``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import ConfigError, EventBatch, hot_budget
from streamrec.ingest import SyntheticStream
from streamrec.model import RankingModel, build_model
from streamrec.trainer.core import TrainerCore
from tests.conftest import small_config
from tests.model.user_pkg import user_package


def test_a_users_module_is_trained_by_the_trainer(tmp_path):
    with user_package(tmp_path) as pkg:
        cfg = small_config(tmp_path, **{"model.module": f"{pkg}.ranking:build", "trainer.batch_size": 256,
                                        "model.bottom_mlp": [16, 5]})  # a user's model: no DLRM-only rule applies
        model = build_model(cfg.model)
        assert type(model).__name__ == "TwoTower" and type(model).__module__ == f"{pkg}.ranking"
        assert isinstance(model, RankingModel)
        again = build_model(cfg.model)  # seeded from model.seed: the same weights in every process
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))

        events = EventBatch.concat(list(SyntheticStream(cfg).batches(4096)), cfg.model.dense_dim,
                                   cfg.model.field_names)
        store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
        core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
        assert type(core.model).__name__ == "TwoTower"
        before = [p.detach().clone() for p in core.model.parameters()]
        core.feed(events)
        core.flush()
        assert core.events == 4096 and np.isfinite(core.metrics.auc) and core.metrics.logloss < 0.75
        assert all(not torch.equal(a, b) for a, b in zip(before, core.model.parameters()))  # it trained
        assert core.predict(events.take(np.arange(8))).shape == (8, 1)  # its [B] made [B, 1]
        store.close()


@pytest.mark.parametrize("path, message", [
    ("{pkg}.nowhere:build", r"model.module: cannot import '\w+\.nowhere' \(ModuleNotFoundError"),
    ("{pkg}.ranking:missing", r"model.module: module '\w+\.ranking' has no attribute 'missing'"),
    ("{pkg}.ranking:torch", r"model.module: '\w+\.ranking:torch' is a module, not a callable builder"),
    ("{pkg}.ranking:not_a_model", r"returned a dict, not a torch.nn.Module ranking model"),
    ("{pkg}.ranking:wrong_shape", r"fails on a probe batch \(dense \[2, 3\], pooled \[2, 24\], on cpu\): TypeError"),
    ("{pkg}.ranking:two_logits", r"returns \(2, 2\) for a batch of 2 \(dense \[2, 3\], pooled \[2, 24\]\), expected one logit per event and "
     r"task \(click\): shape \(2, 1\) or \(2,\)"),
    ("{pkg}.ranking:raises", r"raised while building the model \(RuntimeError: the builder is broken on two lines\)"),
])
def test_a_bad_module_is_one_config_error_line(tmp_path, path, message):
    with user_package(tmp_path) as pkg:
        cfg = small_config(tmp_path, **{"model.module": path.format(pkg=pkg)})
        with pytest.raises(ConfigError, match=message) as e:
            build_model(cfg.model)
        assert "\n" not in str(e.value) and str(e.value).startswith("model.module: ")


@pytest.mark.parametrize("path", ["ranking", "pkg.ranking", "pkg.ranking:", ":build", "pkg ranking:build"])
def test_a_malformed_import_path_is_refused_when_the_config_loads(tmp_path, path):
    with pytest.raises(ConfigError, match="model.module: .* is not an import path of the form 'package.module:builder'"):
        small_config(tmp_path, **{"model.module": path})


def test_an_unknown_architecture_is_refused_when_the_config_loads(tmp_path):
    with pytest.raises(ConfigError, match="model.architecture: must be one of dlrm, dcn_v2, deepfm, mlp, got 'dcn'"):
        small_config(tmp_path, **{"model.architecture": "dcn"})


def test_new_model_keys_at_their_defaults_leave_the_model_hash_alone(tmp_path):
    """A DLRM's checkpoints and snapshots written before ``architecture``/``module``/``cross_layers`` existed keep
    matching (``tasks``, ``params`` and a field's ``dim``/``table`` likewise); setting any of them makes another
    model, another hash."""
    import dataclasses
    import hashlib
    import json

    cfg = small_config(tmp_path)
    old = dataclasses.asdict(cfg.model)
    for key in ("architecture", "module", "cross_layers", "tasks", "params"):
        del old[key]
    for f in old["fields"]:  # a field's own dim and shared table, at their defaults
        del f["dim"], f["table"]
    assert cfg.model_hash() == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    hashes = {small_config(tmp_path, **over).model_hash() for over in (
        {}, {"model.architecture": "mlp"}, {"model.architecture": "dcn_v2"},
        {"model.architecture": "dcn_v2", "model.cross_layers": 2}, {"model.module": "a.b:c"},
        {"model.module": "a.b:c", "model.params": {"experts": 4}}, {"model.module": "a.b:c", "model.params": {"experts": 2}})}
    assert len(hashes) == 7


def test_a_users_module_reads_its_own_settings_from_model_params(tmp_path):
    """``[model.params]`` reaches the builder as ``model_cfg.params``; the builder refuses a bad value naming the
    key, and a key it reads that the table does not set is named too."""
    with user_package(tmp_path) as pkg:
        path = f"{pkg}.ranking:experts"
        toml = tmp_path / "streamrec.toml"
        toml.write_text(f'[model]\nmodule = "{path}"\n\n[model.params]\nexperts = 3\n'
                        '[model.params.gate]\ntemperature = 0.5\n')
        from streamrec.app.config import load_config

        cfg = load_config(str(toml), env={})
        assert cfg.model.params == {"experts": 3, "gate": {"temperature": 0.5}}
        model = build_model(cfg.model)
        assert len(model.experts) == 3
        assert len(build_model(small_config(tmp_path, **{"model.module": path,
                                                         "model.params": {"experts": 5}}).model).experts) == 5
        with pytest.raises(ConfigError, match=r"^model.params.experts: must be an integer >= 1, got 0$"):
            build_model(small_config(tmp_path, **{"model.module": path, "model.params": {"experts": 0}}).model)
        with pytest.raises(ConfigError, match=r"^model.params.experts: the builder '[\w.:]+' reads it, and "
                                              r"\[model.params\] does not set it$"):
            build_model(small_config(tmp_path, **{"model.module": path}).model)


def test_model_params_are_part_of_the_config_the_manifest_and_the_hash(tmp_path):
    import dataclasses

    from streamrec.foundation.model_config import model_config_from_dict

    cfg = small_config(tmp_path, **{"model.module": "a.b:c", "model.params": {"experts": 4, "names": ["x", "y"]}})
    recorded = dataclasses.asdict(cfg.model)  # what a manifest's model_config and a checkpoint hold
    assert recorded["params"] == {"experts": 4, "names": ["x", "y"]}
    assert model_config_from_dict(recorded).model_hash() == cfg.model_hash()
    env = small_config(tmp_path, **{"model.module": "a.b:c", "model.params": '{"experts": 4, "names": ["x", "y"]}'})
    assert env.model.params == cfg.model.params  # a JSON table from STREAMREC_MODEL__PARAMS or --set
    for bad, message in ((["not", "a", "table"], "model.params: expected a table"),
                         ({"when": __import__("datetime").date(2024, 1, 1)}, "model.params.when: is a date"),
                         ({"x": float("nan")}, "model.params.x: must be finite")):
        with pytest.raises(ConfigError, match=message):
            small_config(tmp_path, **{"model.params": bad})
