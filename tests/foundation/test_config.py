"""Configuration: defaults are valid; file, environment and overrides apply in that order; a bad
value, an unknown key or an unreadable file is a ConfigError naming the key and where it came
from; the generator's label noise moves the Bayes-optimal AUC."""

import pytest

from streamrec.foundation import ConfigError, load_config


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
        ("[kafka]\ncodec = 'xml'\n", "kafka.codec: must be 'arrow' or 'json'"),
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
    from streamrec.foundation import ConfigError, load_config

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
    from streamrec.foundation import ConfigError, load_config

    latin = tmp_path / "c.toml"
    latin.write_bytes(b"[trainer]\ndevice = 'caf\xe9'\n")
    with pytest.raises(ConfigError, match=r"c\.toml.*UTF-8"):
        load_config(latin, env={})
    with pytest.raises(ConfigError, match="config file"):
        load_config(tmp_path, env={})


def test_generator_knobs_live_outside_the_model_and_do_not_change_its_hash(tmp_path):
    from streamrec.foundation import load_config

    base = load_config(None, {}, env={})
    other = load_config(None, {"generator.fields": [{"name": "user", "cardinality": 7, "zipf": 2.0, "multi": 4}]},
                        env={})
    assert other.generator.field("user").cardinality == 7
    assert other.model_hash() == base.model_hash()
    assert base.generator.field("not-listed").cardinality == 100_000  # defaults for a field without an entry


def test_a_config_from_before_0_2_has_its_generator_knobs_moved_with_a_warning(tmp_path, caplog):
    from streamrec.foundation import load_config

    p = tmp_path / "old.toml"
    p.write_text('[model]\nfields = [{ name = "user", cardinality = 42, zipf = 1.5 }, { name = "item" }]\n')
    with caplog.at_level("WARNING", logger="streamrec.config"):
        cfg = load_config(p, env={})
    assert cfg.model.field_names == ["user", "item"]
    assert cfg.generator.field("user").cardinality == 42 and cfg.generator.field("user").zipf == 1.5
    assert "now belong in [[generator.fields]]" in caplog.text


def test_removed_keys_say_what_to_do_instead(tmp_path):
    import pytest

    from streamrec.foundation import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"hot\.row_bytes removed; a hot row costs \(model.embedding_dim \+ 1\) \* 4"):
        load_config(None, {"hot.row_bytes": 64}, env={})
    with pytest.raises(ConfigError, match=r"generator: set it in \[\[generator.fields\]\]"):
        load_config(None, {"model.fields": '[{"name": "user", "multi": 2}]'}, env={})
