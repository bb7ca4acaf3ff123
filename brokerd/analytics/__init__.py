"""PySpark analytics over brokerd delivery traces (docs/traces.md, docs/analytics.md).

``brokerd analyze TRACE_DIRS... --out report/`` runs every job of this package over
the trace segments of any number of daemons, joined by conversation id and
sequence number, and writes a JSON summary and an HTML report. The modules:

* :mod:`brokerd.analytics.schema`: the explicit Spark schema of trace schema version 1;
* :mod:`brokerd.analytics.session`: the Spark session (local mode, or ``--master``);
* :mod:`brokerd.analytics.cache`: what a run keeps for the next (class archives, the
  page's JavaScript bundle);
* :mod:`brokerd.analytics.load`: reading segments permissively into one events table;
* :mod:`brokerd.analytics.messages`: one row per message, from SEND to RECEIVE;
* :mod:`~brokerd.analytics.latency`, :mod:`~brokerd.analytics.faults`,
  :mod:`~brokerd.analytics.audit`, :mod:`~brokerd.analytics.delays`,
  :mod:`~brokerd.analytics.throughput`, :mod:`~brokerd.analytics.waiting`: the jobs,
  each table returned unsorted with its order (:mod:`brokerd.analytics.ordered`);
* :mod:`brokerd.analytics.report`: runs the jobs, prints the key tables, writes
  ``summary.json`` and ``report.html`` (charts from :mod:`brokerd.analytics.charts`);
* :mod:`brokerd.analytics.service`: a running analyzer (``brokerd analyzer SOCKET``)
  that keeps one Spark application warm and answers ``brokerd analyze --server``;
* :mod:`brokerd.analytics.synthetic`: a generator of large synthetic trace sets with
  known figures, for tests and benchmarks (and the analyzer's warm-up).

May import: ``brokerd.traces`` (the segment reader), ``brokerd.config`` and
``brokerd.errors``. Nothing of the daemon (storage, dialogs, routing, server).
"""
