"""A soak of brokerd under fire, with an independent checker (``python -m brokerd.tools.soak``).

Three real daemons, an initiator A, a target B and a forwarder F between them,
with a fault proxy in front of every hop; producers send over long-lived dialogs
in both directions, consumer processes receive with the SDK's exactly-once loop
(``BrokerClient.consume()``), and a scheduler SIGKILLs and restarts every daemon
and consumer, stalls consumers (SIGSTOP) and breaks the links. When the time is
up the faults stop, the queues drain, and the checker reads only what the
applications wrote down to report loss, duplication, reordering, corruption and
phantoms (SPEC R-DLG-1). A local stream runs dialogs between two services of one
database of A as well, whose SENDs go straight into the target queue (direct
delivery, R-DLG-13), checked the same way and counted apart. docs/reliability.md
describes the design and the results.

Modules: :mod:`.records` (message bodies and ledger files), :mod:`.topology` (the
deployment), :mod:`.consumer` (the application process that receives),
:mod:`.checker` (the verdict), :mod:`.driver` (the run: start, heal, drain, summary),
:mod:`.producers` (the load: producers and their ledgers), :mod:`.faults` (the fault
schedule and failovers), :mod:`.processes` (starting, killing, stopping and resuming
daemons and consumers), :mod:`.clients` (the soak's own SDK connections),
:mod:`.delivery` (how the local stream's messages travelled, from A's traces),
:mod:`.follow` (finding B's principal) and :mod:`.netns` (running inside a network
namespace of its own).
"""
