"""The OpenAI edge: vLLM's own serving app (app.py) over tandem's engine client
(engine_client.py), behind tandem's middleware (edge.py)."""
