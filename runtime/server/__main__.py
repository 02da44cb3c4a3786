"""`python -m runtime.server [--model PATH] [--host H] [--port P] [--api-key K] ...`

Starts one engine and serves it over HTTP. SIGTERM (or Ctrl-C) shuts down gracefully: new
requests get 503, running ones may finish for `--graceful-timeout` seconds and are then
cancelled, the engine stops, and the process exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import Any

import uvicorn

from runtime import options
from runtime.server.app import build_state, create_app
from runtime.server.tools.reasoning import reasoning_parser_names
from runtime.server.tools.registry import ALIASES, PARSERS

logger = logging.getLogger("runtime.server")
# how long a start waits for the grammar prebuild and the compile workers before it serves
CONSTRAINTS_READY_S = 120


def _chat_flags(p: argparse.ArgumentParser) -> None:
    chat = p.add_argument_group("chat: templates, tool calls, reasoning")
    chat.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template file used instead of the model folder's",
    )
    chat.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help=f"the model's tool-call format: {', '.join(sorted(PARSERS))}; also "
        f"{', '.join(f'{a} ({t})' for a, t in sorted(ALIASES.items()))} "
        "(default: chosen from the chat template)",
    )
    chat.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help=f"separate a thinking model's reasoning: {', '.join(reasoning_parser_names())}",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The server's flags: every option of runtime/options.py's table (server-only, then the
    engine's by group; help and defaults from the table) and the chat flags."""
    p = argparse.ArgumentParser(prog="python -m runtime.server", description=__doc__.split("\n")[2])
    options.add_flags(p, options.OPTIONS)
    _chat_flags(p)
    return p


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The Engine keywords of a parsed command line (all but `model`; options.engine_kwargs)."""
    return options.engine_kwargs(args)


def read_chat_template(path: str | None) -> str | None:
    """The text of `--chat-template FILE` (an OSError names a missing file)."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


class GracefulServer(uvicorn.Server):
    """uvicorn's server, but a stop signal first closes admission and is not re-raised at the
    end (uvicorn re-raises it, which would make the exit status 143 instead of 0)."""

    def __init__(self, config: uvicorn.Config, on_stop: Any) -> None:
        super().__init__(config)
        self._on_stop = on_stop

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._on_stop()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from runtime import Engine
    from runtime.errors import EngineError

    if args.node_rank > 0:  # another machine of a multi-machine engine: its ranks only
        from runtime.default_model import default_model
        from runtime.device import resolve_device
        from runtime.workers.launch import run_node

        model = args.model or str(default_model())
        return run_node(model, args.tp_size, args.pp_size, args.ep_size, args.nnodes,
                        args.node_rank, args.dist_init_addr,
                        resolve_device(args.device).type)  # fmt: skip
    from runtime.server.tools.reasoning import ReasoningParserError, get_reasoning_parser
    from runtime.server.tools.registry import ToolParserError, get_parser

    try:
        if args.tool_call_parser:
            get_parser(args.tool_call_parser)
        if args.reasoning_parser:
            get_reasoning_parser(args.reasoning_parser)
        template = read_chat_template(args.chat_template)
    except (ToolParserError, ReasoningParserError, OSError) as exc:
        logger.error("%s", exc)
        return 2
    try:
        engine = Engine(model=args.model, **engine_kwargs(args))
    except (EngineError, FileNotFoundError, OSError, ValueError) as exc:
        logger.error("cannot start the engine: %s", exc)
        return 2
    if template is not None:
        engine.tokenizer.chat_template = template
    hooks = getattr(getattr(engine, "scheduler", None), "hooks", None)
    if hooks is not None:  # compile workers ready before the first constrained request
        started = time.monotonic()
        if hooks.wait_ready(CONSTRAINTS_READY_S):
            logger.info("constraints ready in %.1f s", time.monotonic() - started)
        else:
            logger.warning("the compile workers were not ready within %d s; constrained "
                           "requests wait for them", CONSTRAINTS_READY_S)  # fmt: skip
    state = build_state(
        engine,
        model_name=args.served_model_name,
        api_key=args.api_key,
        max_queue=args.max_queue,
        max_running=args.max_running_requests,
    )
    state.tool_parser = args.tool_call_parser
    state.reasoning_parser = args.reasoning_parser
    app = create_app(state)

    def stop_admitting() -> None:
        # running requests get most of the grace period, then end with finish_reason "abort"
        state.bridge.begin_drain(max(0.0, args.graceful_timeout - 1.0))

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.graceful_timeout,
        access_log=False,
    )
    server = GracefulServer(config, stop_admitting)
    try:
        server.run()
    finally:
        state.bridge.draining = True
        state.bridge.cancel_all()
        engine.shutdown()
    logger.info("server stopped")
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
