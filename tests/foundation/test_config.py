"""Configuration: defaults are valid; file, environment and overrides apply in that order; a bad
value, an unknown key or an unreadable file is a ConfigError naming the key and where it came
from; the generator's label noise moves the Bayes-optimal AUC."""

import pytest

from streamrec.foundation import ConfigError
from streamrec.app.config import load_config


def test_defaults_are_valid():
    cfg = load_config(None, env={})
    assert cfg.kafka.events_topic == "events"
    assert cfg.model.bottom_mlp[-1] == cfg.model.embedding_dim


def test_file_env_and_override_precedence(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[trainer]\nbatch_size = 64\n[kafka]\npartitions = 2\n')
    cfg = load_config(f, {"trainer.batch_size": "128"}, env={"STREAMREC_KAFKA__PARTITIONS": "8"})
    assert cfg.trainer.batch_size == 128
    assert cfg.kafka.partitions == 8


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[trainer]\nbatch_size = 'big'\n", "trainer.batch_size: expected an integer"),
        ("[trainer]\nbatchsize = 3\n", "unknown key 'batchsize' in [trainer]"),
        ("[nope]\nx = 1\n", "unknown key 'nope'"),
        ("[kafka]\ncodec = 'xml'\n", "kafka.codec: must be one of arrow, json, got 'xml'"),
        ("[model]\nembedding_dim = 8\nbottom_mlp = [4, 4]\n", "model.bottom_mlp: last layer must equal"),
        ("[[model.fields]]\ncardinality = 3\n", "model.fields[0].name: missing required key"),
        ("[model\n", "config file"),
        ("[kafka]\ndlq_topic = 'bad topic!'\n", "kafka.dlq_topic: 'bad topic!' is not a legal Kafka topic name"),
        ("[kafka]\nevents_topic = ''\n", "kafka.events_topic: '' is not a legal Kafka topic name"),
        ("[trainer]\nmax_events = -1\n", "trainer.max_events: must be >= 0"),
        ("[trainer]\nidle_exit_s = -2.0\n", "trainer.idle_exit_s: must be >= 0"),
        ("[serving]\nmax_batch = 0\n", "serving.max_batch: must be >= 1"),
        ("[sketch]\ncheckpoint_interval_s = 0.0\n", "sketch.checkpoint_interval_s: must be > 0"),
        ("[sketch]\npublish_interval_s = -1.0\n", "sketch.publish_interval_s: must be > 0"),
        ("[sketch]\nchange_fraction = 1.5\n", "sketch.change_fraction: must be in (0, 1]"),
        ("[sketch]\ntop_k = 0\n", "sketch.top_k: must be >= 1"),
        ("[sketch]\nsample_rate = 2.0\n", "sketch.sample_rate: must be in [0, 1]"),
        ("[serving]\nmax_message_mb = -1\n", "serving.max_message_mb: must be >= 1"),
        ("[serving]\nprocesses = 0\n", "serving.processes: must be in 1..64"),
        ("[serving]\npush_targets = 'h:\u00b2'\n", "serving.push_targets: 'h:\u00b2' is not host:port"),
    ],
)
def test_bad_config_names_key(tmp_path, text, needle):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(f, env={})
    assert needle in str(e.value)


def test_bad_env_names_variable():
    with pytest.raises(ConfigError, match="trainer.batch_size"):
        load_config(None, env={"STREAMREC_TRAINER__BATCH_SIZE": "x"})
    with pytest.raises(ConfigError, match="unknown section 'bogus'"):
        load_config(None, env={"STREAMREC_BOGUS__X": "1"})


def test_generator_label_noise_lowers_bayes_auc():
    from streamrec.ingest import SyntheticStream

    clean = SyntheticStream(load_config(None, {"generator.label_noise": 1.0}, env={})).bayes_auc(20_000)
    noisy = SyntheticStream(load_config(None, {"generator.label_noise": 2.0}, env={})).bayes_auc(20_000)
    assert noisy < clean - 0.05
    with pytest.raises(ConfigError, match="generator.label_noise: must be > 0"):
        load_config(None, {"generator.label_noise": 0}, env={})


def test_unknown_key_from_env_or_set_names_its_source():
    """An unknown key names where it came from (the environment variable, or the --set override), not
    only "unknown key 'batchsize' in [trainer]", which sends the user looking through config files."""
    with pytest.raises(ConfigError, match="environment variable STREAMREC_TRAINER__BATCHSIZE") as e:
        load_config(None, env={"STREAMREC_TRAINER__BATCHSIZE": "3"})
    assert "unknown key 'batchsize'" in str(e.value)
    with pytest.raises(ConfigError, match="override trainer.batchsize: unknown key 'batchsize'"):
        load_config(None, {"trainer.batchsize": "3"}, env={})


def test_config_refuses_nan(tmp_path):
    """NaN is refused wherever a number is read (override, environment, file): it would pass every range
    check written as `x <= 0` (e.g. trainer.push_give_up_s) and be used as is."""
    from streamrec.foundation import ConfigError
    from streamrec.app.config import load_config

    with pytest.raises(ConfigError, match=r"trainer\.dense_lr: expected a number, got 'nan'"):
        load_config(None, {"trainer.dense_lr": "nan"}, env={})
    with pytest.raises(ConfigError, match=r"trainer\.push_give_up_s"):
        load_config(None, env={"STREAMREC_TRAINER__PUSH_GIVE_UP_S": "NaN"})
    f = tmp_path / "c.toml"
    f.write_text("[generator]\nlabel_noise = nan\n")
    with pytest.raises(ConfigError, match=r"generator\.label_noise"):
        load_config(f, env={})
    assert load_config(None, {"trainer.dense_lr": "0.5"}, env={}).trainer.dense_lr == 0.5


def test_unreadable_config_file_is_a_config_error(tmp_path):
    """A config file that is not UTF-8, or a directory, is a ConfigError naming it (one line from every
    command), not a UnicodeDecodeError or IsADirectoryError traceback."""
    from streamrec.foundation import ConfigError
    from streamrec.app.config import load_config

    latin = tmp_path / "c.toml"
    latin.write_bytes(b"[trainer]\ndevice = 'caf\xe9'\n")
    with pytest.raises(ConfigError, match=r"c\.toml.*UTF-8"):
        load_config(latin, env={})
    with pytest.raises(ConfigError, match="config file"):
        load_config(tmp_path, env={})


def test_generator_knobs_live_outside_the_model_and_do_not_change_its_hash(tmp_path):
    from streamrec.app.config import load_config

    base = load_config(None, {}, env={})
    other = load_config(None, {"generator.fields": [{"name": "user", "cardinality": 7, "zipf": 2.0, "multi": 4}]},
                        env={})
    assert other.generator.field("user").cardinality == 7
    assert other.model_hash() == base.model_hash()
    assert base.generator.field("not-listed").cardinality == 100_000  # defaults for a field without an entry


def test_a_config_from_before_0_2_has_its_generator_knobs_moved_with_a_warning(tmp_path, caplog):
    from streamrec.app.config import load_config

    p = tmp_path / "old.toml"
    p.write_text('[model]\nfields = [{ name = "user", cardinality = 42, zipf = 1.5 }, { name = "item" }]\n')
    with caplog.at_level("WARNING", logger="streamrec.config"):
        cfg = load_config(p, env={})
    assert cfg.model.field_names == ["user", "item"]
    assert cfg.generator.field("user").cardinality == 42 and cfg.generator.field("user").zipf == 1.5
    assert "now belong in [[generator.fields]]" in caplog.text


def test_removed_keys_say_what_to_do_instead(tmp_path):
    import pytest

    from streamrec.foundation import ConfigError
    from streamrec.app.config import load_config

    with pytest.raises(ConfigError, match=r"hot\.row_bytes removed; a hot row costs \(its table's dim \+ 1\) \* 4"):
        load_config(None, {"hot.row_bytes": 64}, env={})
    with pytest.raises(ConfigError, match=r"generator: set it in \[\[generator.fields\]\]"):
        load_config(None, {"model.fields": '[{"name": "user", "multi": 2}]'}, env={})


# Every key whose values are a typing.Literal alias: (section, key, the module that acts on the value,
# the alias's name there). The config annotates the key with that very alias and checks it beside the field.
CHOICE_KEYS = [
    ("kafka", "codec", "streamrec.ingest.ingest_types", "Codec"),
    ("kafka", "consumer_mode", "streamrec.ingest.ingest_types", "ConsumerMode"),
    ("kafka", "on_offsets_lost", "streamrec.ingest.ingest_types", "OffsetsLostPolicy"),
    ("kafka", "security_protocol", "streamrec.ingest.ingest_types", "SecurityProtocol"),
    ("kafka", "sasl_mechanism", "streamrec.ingest.ingest_types", "SaslMechanism"),
    ("store", "cache_admission", "streamrec.embedding_store.store_types", "CacheAdmission"),
    ("store", "unadmitted", "streamrec.embedding_store.store_types", "Unadmitted"),
    ("store", "eviction", "streamrec.embedding_store.store_types", "Eviction"),
    ("serving", "row_precision", "streamrec.snapshot.snapshot_types", "RowPrecision"),
    ("trainer", "dense_optimizer", "streamrec.trainer.trainer_types", "DenseOptimizer"),
    ("trainer", "schedule", "streamrec.trainer.trainer_types", "Schedule"),
    ("trainer", "exchange_precision", "streamrec.trainer.trainer_types", "Precision"),
    ("trainer", "dense_allreduce_precision", "streamrec.trainer.trainer_types", "Precision"),
    ("trainer", "dense_allreduce_compression", "streamrec.trainer.trainer_types", "Compression"),
    ("trainer", "group_batch", "streamrec.trainer.trainer_types", "GroupBatch"),
    ("trainer", "hot_source", "streamrec.trainer.trainer_types", "HotSource"),
    ("model", "architecture", "streamrec.model.model_types", "Architecture"),
    ("join", "mode", "streamrec.joiner.join_types", "JoinMode"),
]


@pytest.mark.parametrize("section, key, module, alias", CHOICE_KEYS, ids=[f"{s}.{k}" for s, k, _, _ in CHOICE_KEYS])
def test_a_choice_key_takes_exactly_the_values_of_its_owners_alias(tmp_path, section, key, module, alias):
    """Each allowed value loads (file, environment, --set); anything else is one line naming the key, the
    value and every allowed value, from wherever it came; a non-string is refused the same way."""
    import dataclasses
    import importlib
    import typing

    from streamrec.app.config import Config

    owned = getattr(importlib.import_module(module), alias)
    section_cls = typing.get_type_hints(Config)[section]
    assert typing.get_type_hints(section_cls)[key] is owned  # one definition, owned by the package that uses it
    allowed = typing.get_args(owned)
    assert len(allowed) >= 2 and all(isinstance(v, str) for v in allowed)
    user = {"kafka.sasl_username": "u"}  # what the SASL_* protocols need besides
    for value in allowed:
        assert getattr(getattr(load_config(None, {**user, f"{section}.{key}": value}, env={}), section), key) == value
    env_name = f"STREAMREC_{section.upper()}__{key.upper()}"
    assert getattr(getattr(load_config(None, user, env={env_name: allowed[-1]}), section), key) == allowed[-1]
    expected = f"{section}.{key}: must be one of {', '.join(allowed)}, got 'nope'"
    f = tmp_path / "c.toml"
    f.write_text(f"[{section}]\n{key} = 'nope'\n")
    for kwargs in ({"path": f}, {"overrides": {f"{section}.{key}": "nope"}}, {"env": {env_name: "nope"}}):
        with pytest.raises(ConfigError) as e:
            load_config(**{"env": {}, **kwargs})
        assert str(e.value) == expected
    with pytest.raises(ConfigError, match=rf"^{section}\.{key}: expected one of .*, got int 3$"):
        load_config(None, {f"{section}.{key}": 3}, env={})
    with pytest.raises(ConfigError, match="^" + expected.replace(".", r"\.") + "$"):  # built in code, not loaded
        dataclasses.replace(getattr(Config(), section), **{key: "nope"})


def test_every_literal_key_is_listed_above():
    """A new Literal-typed key gets a row in CHOICE_KEYS (and so the checks above)."""
    import dataclasses
    import typing

    from streamrec.app.config import Config

    found = {(s.name, f.name) for s in dataclasses.fields(Config)
             for f in dataclasses.fields(typing.get_type_hints(Config)[s.name])
             if typing.get_origin(typing.get_type_hints(typing.get_type_hints(Config)[s.name])[f.name]) is typing.Literal}
    assert found == {(s, k) for s, k, _, _ in CHOICE_KEYS}


def test_the_users_of_a_choice_check_the_same_alias():
    """The modules acting on a value refuse what the config refuses, naming the same allowed values."""
    import numpy as np

    from streamrec.ingest.codec import encode_messages
    from streamrec.ingest.kafka_clients import KafkaSecurityError, client_settings
    from streamrec.trainer.dense_sync import COMPRESSIONS
    from streamrec.trainer.schedule import plan
    from streamrec.trainer.sharding import PRECISIONS, wire_bytes_per_row

    assert COMPRESSIONS == ("none", "powersgd")  # the wire carries the index: the order is part of the format
    assert {p: wire_bytes_per_row(p, 4) for p in PRECISIONS} == {"fp32": 16, "bf16": 8, "fp16": 10}
    with pytest.raises(ValueError, match="schedule must be one of fae, arrival, got 'fifo'"):
        plan(np.zeros(4, bool), 2, "fifo")
    with pytest.raises(ValueError, match="expected one of arrow, json"):
        encode_messages(None, None, "xml", 1)
    cfg = load_config(None, env={})
    cfg.kafka.security_protocol = "SASL"  # set after loading: the client refuses it too
    with pytest.raises(KafkaSecurityError, match="kafka.security_protocol: must be one of PLAINTEXT, SSL"):
        client_settings(cfg.kafka)


@pytest.mark.subprocess
def test_reading_the_config_loads_only_the_sections():
    """Loading the whole config imports each part's config section and the choice aliases beside it, and
    nothing else of theirs: a config reader (the CLI's --help, a sketch worker) loads no torch or numpy."""
    import subprocess
    import sys

    code = ("import sys\nfrom streamrec.app.config import load_config\nload_config(None, env={})\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('streamrec') or m in ('torch', 'numpy'))))")
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              check=True).stdout.split())
    assert not {"torch", "numpy"} & mods
    parts = {m for m in mods if m.startswith("streamrec.") and not m.startswith("streamrec.foundation")
             and m.count(".") > 1}
    assert parts == {"streamrec.app.config", "streamrec.ingest.ingest_config", "streamrec.ingest.ingest_types",
                     "streamrec.embedding_store.store_config", "streamrec.embedding_store.store_types",
                     "streamrec.trainer.trainer_config", "streamrec.trainer.trainer_types",
                     "streamrec.serving.serving_config", "streamrec.snapshot.snapshot_types",
                     "streamrec.sketch.sketch_config", "streamrec.joiner.join_config",
                     "streamrec.joiner.join_types"}


def test_an_ignored_import_fails_the_import_lint(tmp_path):
    """scripts/lint_imports.py: no import-linter contract may list ignore_imports; the layers hold without
    exceptions."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "scripts"))
    import lint_imports

    assert lint_imports.check_no_ignores(root) == []
    (tmp_path / "pyproject.toml").write_text((root / "pyproject.toml").read_text().replace(
        'exhaustive = true\n', 'exhaustive = true\nignore_imports = ["streamrec.foundation.config -> streamrec.app"]\n', 1))
    assert lint_imports.check_no_ignores(tmp_path) == [
        "contract 'layers: benchmarks > application > services > model/snapshot > parts > ingest > foundation' ignores "
        "['streamrec.foundation.config -> streamrec.app']: fix the import instead"]
