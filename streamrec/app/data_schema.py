"""The model config of a command that reads an event file: from the config, or from the file.

``demo --data``, ``produce FILE`` and ``generate --like FILE`` without a model config
take the sparse fields and dense width from the file and print them as TOML, so
the user can save them for the other parts. With a model config, a file that
does not fit it is refused at start, naming the field.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tomllib

from streamrec.foundation import ConfigError
from streamrec.app.config import Config


def model_configured(args) -> bool:
    """Did the user say what the model is: a config file with ``[model]``, ``--set model.*`` or env?"""
    if any(o.strip().startswith("model.") for o in (getattr(args, "overrides", None) or [])):
        return True
    if any(k.startswith("STREAMREC_MODEL__") for k in os.environ):
        return True
    path = getattr(args, "config", None)
    if path:
        try:
            with open(path, "rb") as f:
                return "model" in tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError):
            return True  # load_config already read it; its own error wins
    return False


def model_for_file(cfg: Config, args, path: str, command: str, format: str | None = None) -> Config:
    """``cfg`` whose model fits the file at ``path``; raises ConfigError naming every mismatch."""
    from streamrec.ingest import infer_schema

    schema = infer_schema(path, format=format)
    if model_configured(args):
        problems = schema.mismatches(cfg.model)
        if problems:
            raise ConfigError(f"{path} does not fit the model config: {'; '.join(problems)}. Fix the config (the "
                              f"file holds: fields {', '.join(schema.fields)}, dense_dim {schema.dense_dim}), or "
                              "leave it out to use the file's schema")
        return cfg
    cfg = dataclasses.replace(cfg, model=schema.apply(cfg.model))
    print(f"streamrec {command}: no model config given: the schema of {path} is {len(schema.fields)} sparse "
          f"field{'s' if len(schema.fields) != 1 else ''} ({', '.join(schema.fields)}) and dense_dim "
          f"{schema.dense_dim}. Every part must use the same model: save this as model.toml and pass "
          f"--config model.toml to each of them:\n{schema.toml()}", file=sys.stderr, flush=True)
    return cfg
