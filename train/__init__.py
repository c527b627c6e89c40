"""trainbox: supervised, self-healing training runs (see README.md)."""
