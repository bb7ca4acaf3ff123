"""PySpark analytics over brokerd delivery traces (docs/traces.md, docs/analytics.md).

``brokerd analyze TRACE_DIRS... --out report/`` runs every job of this package over
the trace segments of any number of daemons, joined by conversation id and
sequence number, and writes a JSON summary and an HTML report. The modules:

* :mod:`analytics.schema`: the explicit Spark schema of trace schema version 1;
* :mod:`analytics.session`: the Spark session (local mode, or ``--master``);
* :mod:`analytics.load`: reading segments permissively into one events table;
* :mod:`analytics.messages`: one row per message, from SEND to RECEIVE;
* :mod:`analytics.latency`, :mod:`analytics.faults`, :mod:`analytics.audit`,
  :mod:`analytics.delays`, :mod:`analytics.throughput`, :mod:`analytics.waiting`:
  the jobs;
* :mod:`analytics.report`: runs the jobs, prints the key tables, writes
  ``summary.json`` and ``report.html`` (charts from :mod:`analytics.charts`);
* :mod:`analytics.synthetic`: a generator of large synthetic trace sets with
  known figures, for tests and benchmarks.
"""
