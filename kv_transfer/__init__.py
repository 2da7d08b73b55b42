"""KV handoff between prefill and decode engines. Reading order: README.md."""
