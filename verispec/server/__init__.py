"""`verispec serve`: an OpenAI-compatible HTTP server that batches speculative rounds across requests.

    schemas.py    request shapes, validation, the OpenAI error envelope
    app.py        FastAPI app factory (routes, SSE streaming, auth, /health, /metrics)
    scheduler.py  the worker thread: which requests join the engine's round (verispec.engine.Batch), emit
    metrics.py    Prometheus counters and histograms, one registry per app
"""

from verispec.server.app import Models, ServerSettings, create_app

__all__ = ["Models", "ServerSettings", "create_app"]
