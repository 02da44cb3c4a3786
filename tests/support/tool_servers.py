"""Servers for the tool-calling and reasoning tests: a tiny random Qwen2-architecture model
(SmolLM2's tokenizer) served with one of the chat templates in `examples/chat_templates/`
(`--chat-template`), started once per pytest process and shared by the test modules."""

from __future__ import annotations

import atexit
import tempfile
from pathlib import Path

from tests.support.paths import REPO
from tests.support.server_process import SMALL_ENGINE, ServerProcess

TEMPLATES = REPO / "examples" / "chat_templates"
_model: Path | None = None
_servers: dict[tuple[str, ...], ServerProcess] = {}


def tiny_qwen_dir() -> Path:
    global _model
    if _model is None:
        from tests.support.tiny_models import make_tiny_model

        _model = make_tiny_model(Path(tempfile.mkdtemp(prefix="sgl-tools-qwen-")), kind="qwen2")
    return _model


def template_text(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def template_server(template: str, *flags: str) -> ServerProcess:
    """A server on the tiny Qwen2 model with `examples/chat_templates/<template>.jinja`."""
    key = (template, *flags)
    srv = _servers.get(key)
    if srv is None or srv.proc.poll() is not None:
        path = str(TEMPLATES / f"{template}.jinja")
        srv = ServerProcess(tiny_qwen_dir(), *SMALL_ENGINE, "--chat-template", path, *flags)
        atexit.register(srv.stop)
        _servers[key] = srv
    return srv


def tokenizer_with(template: str):
    """The served model's tokenizer with `template` as its chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_qwen_dir()))
    tok.chat_template = template_text(template)
    return tok
