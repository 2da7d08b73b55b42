"""The KV-aware routing pipeline (see router/README.md for the reading order)."""
