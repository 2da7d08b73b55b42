"""The engine replica's code: the Engine interface and its two engines (README.md)."""
