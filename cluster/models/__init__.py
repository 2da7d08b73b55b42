"""Model preparation: the default demo model (SmolLM2-135M-Instruct, converted from the GGUF
on PyPI) and a tiny random Llama for tests. No Ray, no vLLM; torch and transformers are
imported only when a model is actually built.

Where models go is the caller's choice (the cluster YAML for the default model, the test
fixtures for the tiny one).
"""

from .smollm2 import prepare_smollm2
from .tiny import make_tiny_llama


__all__ = ["make_tiny_llama", "prepare_smollm2"]
