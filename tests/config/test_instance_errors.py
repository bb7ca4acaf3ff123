"""The instance's own settings of the TOML configuration (brokerd/config/; SPEC R-OBJ-1..7),
each bad value refused with the key that holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.frames import DEFAULT_MAX_FRAME_SIZE
from tests.config.helpers import (
    ENDPOINT,
    config_text,
    expect_error,
    load,
)

# ---------------------------------------------------------------------------- errors: instance


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        (ENDPOINT, "data_dir", "is required"),
        (config_text(data_dir="data_dir = 5\n"), "data_dir", "must be a string, not the integer 5"),
        (config_text(data_dir='data_dir = ""\n'), "data_dir", "must not be empty"),
        ('data_dir = "d"\n', "endpoint", "is required"),
        ('data_dir = "d"\nendpoint = 4\n', "endpoint", "must be a table"),
        (
            'data_dir = "d"\n[endpoint]\nprivate_key = "k"\nca_certificate = "c"\n',
            "endpoint.certificate",
            "is required",
        ),
        (
            'data_dir = "d"\n[endpoint]\ncertificate = "c"\nca_certificate = "c"\n',
            "endpoint.private_key",
            "is required",
        ),
        (
            'data_dir = "d"\n[endpoint]\ncertificate = "c"\nprivate_key = "k"\n',
            "endpoint.ca_certificate",
            "is required",
        ),
        (
            'data_dir = "d"\n[endpoint]\ncertificate = 1\nprivate_key = "k"\n'
            'ca_certificate = "c"\n',
            "endpoint.certificate",
            "must be a string",
        ),
        (
            config_text(endpoint='port = "4022"'),
            "endpoint.port",
            "must be an integer, not the string",
        ),
        (config_text(endpoint="port = true"), "endpoint.port", "not the boolean true"),
        (config_text(endpoint="port = 4022.0"), "endpoint.port", "not the float"),
        (config_text(endpoint="port = 0"), "endpoint.port", "between 1 and 65535, not 0"),
        (config_text(endpoint="port = 65536"), "endpoint.port", "between 1 and 65535"),
        (config_text(endpoint='host = ""'), "endpoint.host", "must not be empty"),
        (config_text(endpoint='host = "a b"'), "endpoint.host", "not a host name"),
        (
            config_text(endpoint='encryption = "maybe"'),
            "endpoint.encryption",
            "required, supported",
        ),
        (config_text(endpoint="encryption = true"), "endpoint.encryption", "must be a string"),
        (
            config_text(endpoint='message_forwarding = "yes"'),
            "endpoint.message_forwarding",
            "true or false",
        ),
        (
            config_text(endpoint="message_forwarding = 1"),
            "endpoint.message_forwarding",
            "true or false",
        ),
        (
            config_text(endpoint="message_forward_size = -1"),
            "endpoint.message_forward_size",
            "at least 0",
        ),
        (
            config_text(endpoint="message_forward_size = 1.5"),
            "endpoint.message_forward_size",
            "integer",
        ),
        (config_text(endpoint="max_frame_size = 1000"), "endpoint.max_frame_size", "between 32768"),
        (
            config_text(endpoint="fragments_per_frame = 0"),
            "endpoint.fragments_per_frame",
            "between 1",
        ),
        (
            config_text(endpoint="fragments_per_frame = 4097"),
            "endpoint.fragments_per_frame",
            "4096",
        ),
        (
            config_text(endpoint="max_frame_size = 4294967296"),
            "endpoint.max_frame_size",
            "4294967295",
        ),
        (
            config_text(endpoint="idle_timeout = 0"),
            "endpoint.idle_timeout",
            "positive number of seconds",
        ),
        (config_text(endpoint="connect_timeout = -1"), "endpoint.connect_timeout", "positive"),
        (config_text(endpoint="idle_timeout = nan"), "endpoint.idle_timeout", "positive"),
        (config_text(endpoint="idle_timeout = inf"), "endpoint.idle_timeout", "positive"),
        (config_text(endpoint='idle_timeout = "90"'), "endpoint.idle_timeout", "number of seconds"),
        (
            config_text(endpoint="idle_timeout = false"),
            "endpoint.idle_timeout",
            "number of seconds",
        ),
        (config_text(endpoint="reconnect_initial = 0"), "endpoint.reconnect_initial", "positive"),
        (config_text(endpoint="reconnect_max = -2"), "endpoint.reconnect_max", "positive"),
        (
            config_text(endpoint="reconnect_initial = 3"),
            "endpoint.reconnect_initial",
            "must not exceed endpoint.reconnect_max (2.0)",
        ),
        (config_text(data_dir='data_dir = "d"\nretry = 5\n'), "retry", "must be a table"),
        (config_text(rest="[retry]\ninitial = 0\n"), "retry.initial", "positive"),
        (config_text(rest="[retry]\nmaximum = -1\n"), "retry.maximum", "positive"),
        (config_text(rest="[retry]\nack_delay = 0\n"), "retry.ack_delay", "positive"),
        (config_text(rest="[retry]\ndelayed_retry = 0\n"), "retry.delayed_retry", "positive"),
        (config_text(rest="[retry]\nredial_after = 0\n"), "retry.redial_after", "between 1"),
        (
            config_text(endpoint="heartbeat_interval = 0"),
            "endpoint.heartbeat_interval",
            "positive",
        ),
        (
            config_text(endpoint="heartbeat_deadline = 5"),
            "endpoint.heartbeat_deadline",
            "must exceed endpoint.heartbeat_interval (5.0)",
        ),
        (
            config_text(rest="[retry]\ninitial = 10\nmaximum = 5\n"),
            "retry.initial",
            "must not exceed retry.maximum (5.0)",
        ),
        (
            config_text(rest="[retry]\ninitial = 100\n"),
            "retry.initial",
            "must not exceed retry.maximum (64.0)",
        ),
        (config_text(rest="[client]\nport = 0\n"), "client.port", "between 1 and 65535"),
        (config_text(rest="[client]\nport = 4022\n"), "client.port", "also endpoint.port"),
        (
            config_text(endpoint='host = "0.0.0.0"\nport = 4023'),
            "client.port",
            "also endpoint.port",
        ),
        (config_text(rest='[client]\nhost = ""\n'), "client.host", "must not be empty"),
        (
            config_text(rest='[client]\nhost = "0.0.0.0"\n'),
            "client.host",
            "not a loopback address: a client listener reachable from other hosts must use TLS",
        ),
        (
            config_text(rest='[client]\nhost = "192.0.2.7"\n'),
            "client.host",
            "set client.tls_certificate and client.tls_private_key",
        ),
        (
            config_text(rest='[client]\nhost = "0.0.0.0"\nallow_remote = true\n'),
            "client.allow_remote",
            "is no longer accepted: a client listener on an address that is not loopback needs TLS",
        ),
        (
            config_text(rest='[client]\ntls_certificate = "c.pem"\n'),
            "client.tls_private_key",
            "is required with client.tls_certificate",
        ),
        (
            config_text(rest='[[client.token]]\nname = "shop"\nfile = "shop.token"\n'),
            "client.token[0].role",
            "is required (one of admin, application)",
        ),
        (
            config_text(rest='[[client.token]]\nname = "shop"\nfile = "s.token"\nrole = "app"\n'),
            "client.token[0].role",
            "must be one of admin, application",
        ),
        (
            config_text(
                rest='[[client.token]]\nname = "shop"\nfile = "s.token"\nrole = "application"\n'
            ),
            "client.token[0].services",
            "needs the services it may use",
        ),
        (
            config_text(
                rest='[[client.token]]\nname = "ops"\nfile = "o.token"\nrole = "admin"\n'
                'queues = ["Q"]\n'
            ),
            "client.token[0].queues",
            "an admin token may do everything",
        ),
        (
            config_text(
                rest='[[client.token]]\nname = "a"\nfile = "a.token"\nrole = "admin"\n'
                '[[client.token]]\nname = "a"\nfile = "b.token"\nrole = "admin"\n'
            ),
            "client.token[1].name",
            "client token 'a' is already defined at client.token[0]",
        ),
        (config_text(rest="[client]\ntoken_file = 3\n"), "client.token_file", "must be a string"),
        (
            config_text(rest="[limits]\nmax_message_size = 0\n"),
            "limits.max_message_size",
            "between 1 and 134217728",
        ),
        (  # a received message must fit one client frame
            config_text(rest="[limits]\nmax_message_size = 134217729\n"),
            "limits.max_message_size",
            "between 1 and 134217728",
        ),
        (
            config_text(rest="[limits]\nmax_message_size = true\n"),
            "limits.max_message_size",
            "integer",
        ),
        (
            config_text(rest="[limits]\nbacklog_page = 0\n"),
            "limits.backlog_page",
            "at least 1",
        ),
        (  # a peer's flood of new services must not leave the pairs unbounded (R-ROUTE-10)
            config_text(rest="[limits]\nmirror_pairs = 0\n"),
            "limits.mirror_pairs",
            "at least 1",
        ),
        (  # no request at all would leave step 4 DELAYED for ever (R-ROUTE-14)
            config_text(rest="[limits]\nroute_requests = 0\n"),
            "limits.route_requests",
            "at least 1",
        ),
        (  # no partial message at all would hold every message of several for ever (R-DLG-7)
            config_text(rest="[limits]\npartial_messages = 0\n"),
            "limits.partial_messages",
            "at least 1",
        ),
        (  # SQLite's cache_size counts KiB in 32 bits: more would silently be no cache
            config_text(rest="[limits]\npage_cache_mb = 4097\n"),
            "limits.page_cache_mb",
            "between 1 and 4096",
        ),
        (  # a segment's offsets have 40 bits; one is deleted or compacted whole
            config_text(rest="[limits]\nbody_segment_mb = 0\n"),
            "limits.body_segment_mb",
            "between 1 and 1024",
        ),
        (
            config_text(rest="[limits]\nbody_compact_after = -1\n"),
            "limits.body_compact_after",
            "positive number of seconds",
        ),
        (
            config_text(rest="[limits]\nsend_window = 0\n"),
            "limits.send_window",
            "between 1 and 1000000",
        ),
        (  # a backlog's messages may have the larger bound, never a smaller one
            config_text(rest="[limits]\nsend_window = 3000\nbacklog_send_window = 2999\n"),
            "limits.backlog_send_window",
            "must not be below limits.send_window (3000)",
        ),
        (
            config_text(rest="[limits]\nsend_window_mb = 0\n"),
            "limits.send_window_mb",
            "between 1 and 4096",
        ),
        (
            config_text(rest="[limits]\nfragment_size = 1023\n"),
            "limits.fragment_size",
            "between 1024",
        ),
        (
            config_text(rest=f"[limits]\nfragment_size = {DEFAULT_MAX_FRAME_SIZE - 8191}\n"),
            "limits.fragment_size",
            f"between 1024 and {DEFAULT_MAX_FRAME_SIZE - 8192}",
        ),
        (
            config_text(
                endpoint="max_frame_size = 40000", rest="[limits]\nfragment_size = 32000\n"
            ),
            "limits.fragment_size",
            "between 1024 and 31808",
        ),
    ],
)
def test_instance_settings_are_validated(tmp_path: Path, text: str, key: str, problem: str) -> None:
    expect_error(tmp_path, text, key, problem)


def test_fragment_size_bounds_are_inclusive(tmp_path: Path) -> None:
    top = DEFAULT_MAX_FRAME_SIZE - 8192
    assert load(tmp_path, rest=f"[limits]\nfragment_size = {top}\n").limits.fragment_size == top
    assert load(tmp_path, rest="[limits]\nfragment_size = 1024\n").limits.fragment_size == 1024


def test_the_backlog_page_is_read(tmp_path: Path) -> None:
    assert load(tmp_path).limits.backlog_page == 256
    assert load(tmp_path, rest="[limits]\nbacklog_page = 16\n").limits.backlog_page == 16
