"""sgl_dsl: prompt programs with gen / select / fork / roles, run on a backend.

import sgl_dsl as sgl
sgl.set_default_backend(sgl.Runtime())             # the in-process engine
sgl.set_default_backend(sgl.RuntimeEndpoint(url))  # or a `python -m runtime.server`
sgl.set_default_backend(sgl.OpenAI(model, base_url))  # or any OpenAI-compatible server

The API is SGLang's frontend API (same names, signatures and semantics), so SGLang programs
run unchanged with `import sgl_dsl as sgl`; see examples/sglang_programs.py.
"""

from __future__ import annotations

from .api import SglFunction, function
from .backend import (
    flush_cache,
    get_default_backend,
    get_server_info,
    global_config,
    set_default_backend,
)
from .backend.base import Backend, GenChunk, GenOutput
from .backend.runtime import Runtime
from .chat_template import ChatTemplate
from .errors import BackendError, NoBackendError, ProgramError, SglError, TraceError
from .ir import Program
from .primitives import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    system,
    system_begin,
    system_end,
    tool_loop,
    user,
    user_begin,
    user_end,
    video,
)
from .select_methods import (
    ChoiceScores,
    SelectMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from .state import ForkGroup, ProgramState
from .tools import ToolCall


def __getattr__(name: str) -> object:
    # the HTTP backend imports httpx; load it only when a program asks for it
    if name == "RuntimeEndpoint":
        from .backend.endpoint import RuntimeEndpoint

        return RuntimeEndpoint
    if name == "OpenAI":
        from .backend.openai import OpenAI

        return OpenAI
    raise AttributeError(f"module 'sgl_dsl' has no attribute {name!r}")


__all__ = [
    "Backend",
    "BackendError",
    "ChatTemplate",
    "ChoiceScores",
    "ForkGroup",
    "GenChunk",
    "GenOutput",
    "NoBackendError",
    "OpenAI",
    "Program",
    "ProgramError",
    "ProgramState",
    "Runtime",
    "RuntimeEndpoint",
    "SelectMethod",
    "SglError",
    "SglFunction",
    "ToolCall",
    "TraceError",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "image",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "tool_loop",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]
