"""brokerd: the broker daemon, its CLI and tools (see README.md)."""
