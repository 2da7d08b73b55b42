"""Standalone NIXL block-transfer benchmark: `python -m kv_transfer.bench` (torch + NIXL only).

`nixl_transfer.py` moves the bytes between two processes; `__main__.py` adds the memcpy
reference, the JSON and the plot. See kv_transfer/README.md.
"""
