"""storage.elasticsearch: defaults, one URL or several, errors with file:line, secrets kept out of repr."""

from __future__ import annotations

import pytest

from ftwatch.config.model import load_config
from ftwatch.errors import ConfigError


def test_one_url_or_several_and_the_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("storage:\n  elasticsearch:\n    url: https://es:9200\n    api_key: SECRETKEY\n")
    es = load_config(path).storage.elasticsearch
    assert es.url == ["https://es:9200"] and es.data_stream_prefix == "ftwatch" and es.batch_size == 500
    assert es.buffer_dir is None and "SECRETKEY" not in repr(es)
    path.write_text("storage:\n  elasticsearch:\n    url: [http://a:9200, http://b:9200]\n")
    assert load_config(path).storage.elasticsearch.url == ["http://a:9200", "http://b:9200"]


def test_no_elasticsearch_by_default(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("storage: {}\n")
    assert load_config(path).storage.elasticsearch is None


@pytest.mark.parametrize("body, message", [
    ("    url: es:9200\n", "3: storage.elasticsearch.url: url must start with http"),
    ("    url: http://es:9200\n    username: elastic\n", "username and password go together"),
    ("    url: http://es:9200\n    api_key: k\n    username: u\n    password: p\n", "not both"),
    ("    url: http://es:9200\n    data_stream_prefix: Bad-Prefix\n", "4: storage.elasticsearch.data_stream_prefix"),
    ("    url: http://es:9200\n    retention: 90 days\n", "4: storage.elasticsearch.retention"),
])
def test_bad_settings_name_the_line(tmp_path, body, message):
    path = tmp_path / "c.yaml"
    path.write_text("storage:\n  elasticsearch:\n" + body)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in str(err.value)
