"""The application SDK: Service Broker verbs over the daemon's client listener (SPEC §6).

May import: ``protocol`` only (and the standard library). It never imports the
daemon, so an application needs nothing of it.
"""
