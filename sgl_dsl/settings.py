"""Every environment variable the sgl_dsl package reads, declared once (the kinds are
`grammar.settings'`); docs/configuration.md lists them. Only the `OpenAI` backend reads these,
and imports this module when one is made, so `import sgl_dsl` stays light."""

from __future__ import annotations

from grammar.settings import Setting, Text

OPENAI_BASE_URL = Text(
    "OPENAI_BASE_URL",
    "https://api.openai.com/v1",
    "The server `sgl.OpenAI(model)` talks to when no `base_url` is given (the `openai` "
    "package's own variable).",
)
OPENAI_API_KEY = Text(
    "OPENAI_API_KEY",
    None,
    "The bearer token `sgl.OpenAI(model)` sends when no `api_key` is given; unset: none.",
)

SETTINGS: tuple[Setting, ...] = (OPENAI_BASE_URL, OPENAI_API_KEY)
