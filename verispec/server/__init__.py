"""`verispec serve`: an OpenAI-compatible HTTP server that batches speculative rounds across requests.

    schemas.py    request shapes, validation, the OpenAI error envelope
    app.py        FastAPI app factory (routes, SSE streaming, auth, /health, /metrics)
    scheduler.py  the worker thread: which requests join the engine's round (verispec.engine.Batch), emit
    metrics.py    Prometheus counters and histograms, one registry per app
    drift.py      the drift watch: acceptance per strategy against its baseline, plain decoding when it no longer pays
    replicas.py   what several replicas need: the app called in-process, conversation keys, merged metrics
    ray_serve.py  `serve --backend ray`: replicas of the app on Ray Serve (optional extra; imports ray)
"""

from verispec.server.app import Models, ServerSettings, create_app

__all__ = ["Models", "ServerSettings", "create_app"]
