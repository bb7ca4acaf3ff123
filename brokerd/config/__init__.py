"""The TOML configuration of one broker daemon (one instance): ``brokerd run --config FILE``.

This package owns reading and validating that file, and nothing else. It turns the TOML
into frozen dataclasses, resolves relative paths against the file's own directory and
refuses every mistake it can see without touching the disk or the network, raising
:class:`~brokerd.errors.ConfigError` with the file, the dotted key
(``database[0].service[1].queue``) and the problem in plain English. It does not open
certificate files, create databases or bind ports: the daemon and the store do that.

What a file declares (SPEC section 1):

* R-OBJ-1 message types: a name and a validation (``none``, ``empty``,
  ``well_formed_xml``).
* R-OBJ-2 contracts: a name and the message types each role may send (``sent_by`` is
  ``initiator``, ``target`` or ``any``). Every database implicitly has the message type
  ``DEFAULT`` (validation ``none``) and the contract ``DEFAULT`` (``DEFAULT`` sent by
  ``any``); the store creates them, the file may use but not redefine them, and they are
  not listed in :attr:`DatabaseConfig.message_types` / :attr:`DatabaseConfig.contracts`.
* R-OBJ-3 queues: a name, status on/off, the retention flag and external activation
  (``activation = { command = [...], max_instances = n }``: the program the daemon starts
  when the queue's messages are not drained).
* R-OBJ-4 services: a name (case-sensitive, compared byte-for-byte), the queue and the
  contracts the service accepts as a target.
* R-OBJ-5 routes: ``name``, ``remote_service_name``, ``broker_instance``, ``address``
  (``LOCAL``, ``TRANSPORT`` or ``tcp://host:port``), ``mirror_address`` and ``lifetime``;
  a lifetime given in seconds counts from the moment the file is read and is stored as an
  absolute UTC expiry.
* R-OBJ-6 the route ``AutoCreatedLocal`` belongs to the store, which creates it in every
  database; a file may only restate it exactly as (NULL, NULL, ``LOCAL``, NULL).
* R-OBJ-7 the endpoint: listen address (port 4022), certificate, ``encryption``,
  ``message_forwarding`` and ``message_forward_size`` (MB).

Besides these, the daemon's own settings: retransmission timing (R-DLG-6, ``[retry]``),
the local client listener (``[client]``), the admin HTTP port (``[admin] listen``:
health, metrics, the web console) and message size limits (R-DLG-7,
``[limits]``). Each database becomes one file, so database names are restricted to
``[A-Za-z0-9_-]+`` and compared without regard to case; ``master`` is refused, and
``msdb`` (the routes for traffic from outside the instance, R-ROUTE-1) is always present.

Name comparisons: message types, contracts and services travel between brokers and are
compared byte-for-byte; queue and route names are local identifiers (SQL identifiers in
Service Broker) and must be unique without regard to case, although references to a
queue must spell it exactly. Enumerated values (``encryption``, ``validation``,
``sent_by``, queue ``status``) are accepted in any case and stored in lower case; route
addresses ``LOCAL`` / ``TRANSPORT`` are stored in upper case.

May import: ``brokerd.errors`` and ``protocol``. Nothing else of brokerd.
"""

from __future__ import annotations

from brokerd.config.addresses import normal_tcp_address, parse_tcp_address
from brokerd.config.databases import parse_route
from brokerd.config.loading import load_config, parse_config
from brokerd.config.model import (
    CLIENT_ROLES,
    MIRROR_ROLES,
    MIRROR_WHEN_LOST,
    SENT_BY,
    VALIDATIONS,
    ActivationConfig,
    AdminConfig,
    BrokerConfig,
    ClientConfig,
    ClientToken,
    ContractConfig,
    ContractMessage,
    DatabaseConfig,
    EndpointConfig,
    LimitsConfig,
    MessageTypeConfig,
    PoisonHandling,
    PoisonPolicy,
    QueueConfig,
    RemoteServiceBindingConfig,
    RetryConfig,
    RouteConfig,
    ServiceConfig,
    TraceConfig,
)
from brokerd.config.tables import INT_MAX

__all__ = [
    "CLIENT_ROLES",
    "INT_MAX",
    "MIRROR_ROLES",
    "MIRROR_WHEN_LOST",
    "SENT_BY",
    "VALIDATIONS",
    "ActivationConfig",
    "AdminConfig",
    "BrokerConfig",
    "ClientConfig",
    "ClientToken",
    "ContractConfig",
    "ContractMessage",
    "DatabaseConfig",
    "EndpointConfig",
    "LimitsConfig",
    "MessageTypeConfig",
    "PoisonHandling",
    "PoisonPolicy",
    "QueueConfig",
    "RemoteServiceBindingConfig",
    "RetryConfig",
    "RouteConfig",
    "ServiceConfig",
    "TraceConfig",
    "load_config",
    "normal_tcp_address",
    "parse_config",
    "parse_route",
    "parse_tcp_address",
]
