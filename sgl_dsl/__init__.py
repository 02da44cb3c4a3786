"""sgl_dsl: prompt programs with gen / select / fork / roles, run on a backend.

import sgl_dsl as sgl
sgl.set_default_backend(sgl.Runtime())             # the in-process engine
sgl.set_default_backend(sgl.RuntimeEndpoint(url))  # or a `python -m runtime.server`
"""

from __future__ import annotations

from .api import SglFunction, function
from .backend import get_default_backend, set_default_backend
from .backend.base import Backend, GenChunk, GenOutput
from .backend.runtime import Runtime
from .chat_template import ChatTemplate
from .errors import BackendError, NoBackendError, ProgramError, SglError, TraceError
from .ir import Program
from .primitives import assistant, gen, select, system, user
from .select_methods import ChoiceScores, SelectMethod
from .state import ForkGroup, ProgramState


def __getattr__(name: str) -> object:
    # the HTTP backend imports httpx; load it only when a program asks for it
    if name == "RuntimeEndpoint":
        from .backend.endpoint import RuntimeEndpoint

        return RuntimeEndpoint
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
    "Program",
    "ProgramError",
    "ProgramState",
    "Runtime",
    "RuntimeEndpoint",
    "SelectMethod",
    "SglError",
    "SglFunction",
    "TraceError",
    "assistant",
    "function",
    "gen",
    "get_default_backend",
    "select",
    "set_default_backend",
    "system",
    "user",
]
