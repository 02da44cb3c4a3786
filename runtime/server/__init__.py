"""An OpenAI-compatible HTTP server in front of one `runtime.Engine`.

python -m runtime.server [--model PATH] [--host 127.0.0.1] [--port 30000] [--api-key KEY]

`create_app(build_state(engine))` gives the ASGI app for an engine built elsewhere.
"""

from runtime.server.app import build_state, create_app

__all__ = ["build_state", "create_app"]
