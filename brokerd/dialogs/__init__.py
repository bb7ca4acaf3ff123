"""Dialogs: conversation endpoints, their state machine, sequencing, reassembly and
the dialog engine that applies application verbs and peer fragments to them
(SPEC §4, §5).

Modules, from the models up:

* ``states`` (the endpoint state machine as data, pure), ``endpoint`` (an
  endpoint and its unacknowledged messages), ``ready`` (messages ready to
  RECEIVE, by conversation group), ``database`` (one database's image and its
  recovery), ``work`` (a unit of work), ``links`` (what a link is asked to send),
  ``stats``;
* ``binding`` (who may speak for a conversation's far side, pure) and
  ``service_keys`` (service key pairs and remote service bindings), R-DLG-14;
* ``deadlines`` (timers and lifetimes);
* the router (where messages go): ``router_core`` (its state), ``route_decisions``
  (the route of each conversation), ``inbound`` (messages from outside,
  forwarding), ``route_admin``, ``route_requests`` (dynamic routing),
  ``mirror_roles`` (mirroring), ``router`` (joins them);
* ``transmission`` (sending, retransmission, acknowledgements), ``local_link``;
* the engine: ``core`` (state, lookups, commits), ``send_verbs`` (SEND),
  ``receive_verbs`` (RECEIVE), ``verbs`` (the application's other verbs, on both),
  ``receiving`` (what arrives from links), ``fragment_acks`` (what a sender takes
  from the fragments an acknowledgement names), ``local_arrivals`` and
  ``remote_arrivals`` (the runs of one dialog that the local link and a connection hand over),
  ``engine`` (joins them; life cycle and tick), ``transactions`` (client
  transactions), ``views``.

May import: ``protocol``, ``brokerd.storage``, ``brokerd.routing``,
``brokerd.traces``, ``brokerd.config``, ``brokerd.errors``. Never ``brokerd.server``
(connections reach the engine through the ``Link`` protocol it declares) or the SDK.
"""
