"""Administration: ``brokerctl`` and the views it prints.

May import: ``brokerd.sdk``, ``protocol`` and ``brokerd.config`` (to find a daemon's
client port and token from its configuration file). Never the daemon itself.
"""
