"""What the configuration's tests share: the files they write and how an error is checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.config import (
    BrokerConfig,
    load_config,
)
from brokerd.errors import ConfigError
from protocol.frames import MAX_NAME_BYTES

UUID1 = "8c2f4a1e-0b7d-4c3a-9e55-0a1f0e3b7c11"

ENDPOINT = """\
[endpoint]
certificate = "certs/a.pem"
private_key = "certs/a.key"
ca_certificate = "certs/ca.pem"
"""

SHOP = """\
[[database]]
name = "shop"
[[database.message_type]]
name = "//shop/Request"
validation = "well_formed_xml"
[[database.contract]]
name = "//shop/Contract"
messages = [{ message_type = "//shop/Request", sent_by = "initiator" }]
[[database.queue]]
name = "ShopQueue"
[[database.service]]
name = "//shop/Orders"
queue = "ShopQueue"
contracts = ["//shop/Contract"]
"""


def config_text(endpoint: str = "", rest: str = "", data_dir: str = 'data_dir = "data"\n') -> str:
    """A minimal valid file; ``endpoint`` lines go into [endpoint], ``rest`` after it."""
    return data_dir + ENDPOINT + endpoint + "\n" + rest


def write(tmp_path: Path, text: str, name: str = "broker.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, endpoint: str = "", rest: str = "") -> BrokerConfig:
    return load_config(write(tmp_path, config_text(endpoint, rest)))


def expect_error(tmp_path: Path, text: str, key: str, problem: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    message = str(err)
    assert str(path) in message
    assert err.key == key, message
    assert key in message
    assert problem in message, message
    return err


def db(body: str, name: str = "shop") -> str:
    """A minimal file with one database (``name``) holding ``body``."""
    return config_text(rest=f'[[database]]\nname = "{name}"\n{body}')


LONG = "x" * (MAX_NAME_BYTES + 1)
"""A name one byte over the limit."""
