"""The databases of the TOML configuration (brokerd/config/; SPEC R-OBJ-1..7): message types,
contracts, queues and services, each bad object refused with the key that holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.config import (
    load_config,
)
from protocol.frames import MAX_NAME_BYTES
from tests.config.helpers import (
    LONG,
    SHOP,
    UUID1,
    config_text,
    db,
    expect_error,
    write,
)

# ---------------------------------------------------------------------------- errors: databases


def contract(name: str, messages: str) -> str:
    return f'[[database.contract]]\nname = "{name}"\nmessages = [{messages}]\n'


QUEUE_Q = '[[database.queue]]\nname = "q"\n'
SERVICE_S = '[[database.service]]\nname = "s"\nqueue = "q"\n'
LONG_UTF8 = "é" * (MAX_NAME_BYTES // 2 + 1)  # fewer characters than the limit, more bytes


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        # databases
        (config_text(rest="[database]\nname = 'x'\n"), "database", "must be an array of tables"),
        (config_text(rest="[[database]]\n"), "database[0].name", "is required"),
        (db("", name=""), "database[0].name", "must not be empty"),
        (db("", name="my shop"), "database[0].name", "only letters, digits, '_' and '-'"),
        (db("", name="../etc"), "database[0].name", "it becomes a file name"),
        (db("", name="master"), "database[0].name", "'master' is reserved"),
        (db("", name="Master"), "database[0].name", "'master' is reserved"),
        (db("", name="MSDB"), "database[0].name", "write the msdb database's name as 'msdb'"),
        (
            db('[[database]]\nname = "Shop"\n'),
            "database[1].name",
            "database 'Shop' is already defined at database[0]",
        ),
        (db('broker_instance = "not-a-uuid"\n'), "database[0].broker_instance", "is not a UUID"),
        (db("broker_instance = 5\n"), "database[0].broker_instance", "must be a string"),
        (
            db(
                f'broker_instance = "{UUID1}"\n'
                f'[[database]]\nname = "b"\nbroker_instance = "{UUID1}"\n'
            ),
            "database[1].broker_instance",
            "is already used by database[0]",
        ),
        # names
        (db(f'[[database.queue]]\nname = "{LONG}"\n'), "database[0].queue[0].name", "1025 bytes"),
        (
            db(f'[[database.service]]\nname = "{LONG_UTF8}"\nqueue = "q"\n'),
            "database[0].service[0].name",
            f"at most {MAX_NAME_BYTES}",
        ),
        (
            db('[[database.message_type]]\nname = ""\n'),
            "database[0].message_type[0].name",
            "must not be empty",
        ),
        (
            db("[[database.message_type]]\nvalidation = 'none'\n"),
            "database[0].message_type[0].name",
            "is required",
        ),
        (db("[[database.queue]]\nname = 7\n"), "database[0].queue[0].name", "must be a string"),
        # message types
        (
            db('[[database.message_type]]\nname = "m"\nvalidation = "xml"\n'),
            "database[0].message_type[0].validation",
            "must be one of none, empty, well_formed_xml, not 'xml'",
        ),
        (
            db('[[database.message_type]]\nname = "m"\n[[database.message_type]]\nname = "m"\n'),
            "database[0].message_type[1].name",
            "message type 'm' is already defined in database 'shop' at database[0].message_type[0]",
        ),
        (
            db('[[database.message_type]]\nname = "DEFAULT"\n'),
            "database[0].message_type[0].name",
            "'DEFAULT' is built in",
        ),
        (db("message_type = 3\n"), "database[0].message_type", "must be an array of tables"),
        (db("message_type = [1]\n"), "database[0].message_type[0]", "must be a table"),
        # contracts
        (
            db(contract("DEFAULT", '{message_type = "DEFAULT", sent_by = "any"}')),
            "database[0].contract[0].name",
            "'DEFAULT' is built in",
        ),
        (
            db('[[database.contract]]\nname = "c"\n'),
            "database[0].contract[0].messages",
            "is required",
        ),
        (
            db('[[database.contract]]\nname = "c"\nmessages = []\n'),
            "database[0].contract[0].messages",
            "needs at least one message type",
        ),
        (
            db(contract("c", '{message_type = "m", sent_by = "any"}')),
            "database[0].contract[0].messages[0].message_type",
            "message type 'm' is not defined in database 'shop'",
        ),
        (
            db(
                '[[database.message_type]]\nname = "//A"\n'
                + contract("c", '{message_type = "//a", sent_by = "any"}')
            ),
            "database[0].contract[0].messages[0].message_type",
            "case-sensitive: did you mean '//A'?",
        ),
        (
            db(contract("c", '{message_type = "DEFAULT", sent_by = "both"}')),
            "database[0].contract[0].messages[0].sent_by",
            "must be one of initiator, target, any, not 'both'",
        ),
        (
            db('[[database.contract]]\nname = "c"\nmessages = [{message_type = "DEFAULT"}]\n'),
            "database[0].contract[0].messages[0].sent_by",
            "is required",
        ),
        (
            db('[[database.contract]]\nname = "c"\nmessages = [{sent_by = "any"}]\n'),
            "database[0].contract[0].messages[0].message_type",
            "is required",
        ),
        (
            db(
                contract(
                    "c",
                    '{message_type = "DEFAULT", sent_by = "initiator"}, '
                    '{message_type = "DEFAULT", sent_by = "target"}',
                )
            ),
            "database[0].contract[0].messages[1].message_type",
            "listed twice",
        ),
        (
            db('[[database.contract]]\nname = "c"\nmessages = ["DEFAULT"]\n'),
            "database[0].contract[0].messages[0]",
            "must be a table",
        ),
        (
            db(
                contract("c", '{message_type = "DEFAULT", sent_by = "any"}')
                + contract("c", '{message_type = "DEFAULT", sent_by = "any"}')
            ),
            "database[0].contract[1].name",
            "contract 'c' is already defined",
        ),
        # queues
        (
            db('[[database.queue]]\nname = "q"\nstatus = "maybe"\n'),
            "database[0].queue[0].status",
            'must be "on", "off", true or false',
        ),
        (
            db('[[database.queue]]\nname = "q"\nstatus = 1\n'),
            "database[0].queue[0].status",
            "not the integer 1",
        ),
        (
            db('[[database.queue]]\nname = "q"\nretention = "no"\n'),
            "database[0].queue[0].retention",
            "true or false",
        ),
        (
            db('[[database.queue]]\nname = "q"\npoison_message_handling = "pause"\n'),
            "database[0].queue[0].poison_message_handling",
            "must be one of quarantine, disable, off",
        ),
        (
            db('[[database.queue]]\nname = "q"\npoison_rollbacks = 0\n'),
            "database[0].queue[0].poison_rollbacks",
            "must be between 1 and 1000000",
        ),
        (
            db('[[database.queue]]\nname = "Q"\n[[database.queue]]\nname = "q"\n'),
            "database[0].queue[1].name",
            "queue 'q' is already defined in database 'shop' at database[0].queue[0] "
            "(compared without regard to case)",
        ),
        # services
        (
            db('[[database.service]]\nname = "s"\nqueue = "X"\n'),
            "database[0].service[0].queue",
            "queue 'X' is not defined in database 'shop'",
        ),
        (
            db(
                '[[database.queue]]\nname = "ShopQueue"\n'
                '[[database.service]]\nname = "s"\nqueue = "shopqueue"\n'
            ),
            "database[0].service[0].queue",
            "did you mean 'ShopQueue'?",
        ),
        (db('[[database.service]]\nname = "s"\n'), "database[0].service[0].queue", "is required"),
        (
            db(QUEUE_Q + SERVICE_S + 'contracts = ["nope"]\n'),
            "database[0].service[0].contracts[0]",
            "contract 'nope' is not defined in database 'shop'",
        ),
        (
            db(QUEUE_Q + SERVICE_S + 'contracts = "DEFAULT"\n'),
            "database[0].service[0].contracts",
            "must be an array of strings",
        ),
        (
            db(QUEUE_Q + SERVICE_S + 'contracts = ["DEFAULT", 1]\n'),
            "database[0].service[0].contracts[1]",
            "must be a non-empty string",
        ),
        (
            db(
                '[[database.queue]]\nname = "q"\n[[database.service]]\nname = "s"\nqueue = "q"\n'
                'contracts = ["DEFAULT", "DEFAULT"]\n'
            ),
            "database[0].service[0].contracts[1]",
            "listed twice",
        ),
        (
            db(
                '[[database.queue]]\nname = "q"\n[[database.service]]\nname = "//s"\nqueue = "q"\n'
                '[[database.service]]\nname = "//s"\nqueue = "q"\n'
            ),
            "database[0].service[1].name",
            "service '//s' is already defined in database 'shop'",
        ),
    ],
)
def test_database_objects_are_validated(tmp_path: Path, text: str, key: str, problem: str) -> None:
    expect_error(tmp_path, text, key, problem)


def test_service_names_are_case_sensitive(tmp_path: Path) -> None:
    """R-OBJ-4: //s and //S are two services."""
    cfg = load_config(
        write(
            tmp_path,
            db(
                '[[database.queue]]\nname = "q"\n[[database.service]]\nname = "//s"\nqueue = "q"\n'
                '[[database.service]]\nname = "//S"\nqueue = "q"\n'
            ),
        )
    )
    assert [s.name for s in cfg.database("shop").services] == ["//s", "//S"]


def test_names_at_the_byte_limit_are_accepted(tmp_path: Path) -> None:
    name = "é" * (MAX_NAME_BYTES // 2)
    cfg = load_config(write(tmp_path, db(f'[[database.message_type]]\nname = "{name}"\n')))
    assert cfg.database("shop").message_types[0].name == name


def test_same_object_names_in_two_databases_are_fine(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, config_text(rest=SHOP + SHOP.replace('"shop"', '"shop2"'))))
    assert cfg.database("shop").services == cfg.database("shop2").services
