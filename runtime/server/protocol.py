"""Request bodies of every endpoint, as pydantic models.

OpenAI fields keep OpenAI's names; engine extras (`top_k`, `min_p`, `repetition_penalty`,
`ignore_eos`, `regex`, ...) are accepted beside them, as `extra_body` in the `openai` client.
Responses are plain dicts built in `responses.py`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.server.errors import APIError


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class BootstrapFields(_Body):
    """What the SGLang Model Gateway adds in PD mode: the prefill server's host and bootstrap
    port, and the room (a random 63-bit id) both servers know the request by. For a request
    that makes several generations (`n > 1`) the gateway sends a list of each, one per
    generation: a PD server makes one generation per request, so that is a 400 naming it."""

    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int] | None = None
    bootstrap_room: int | list[int] | None = None

    def bootstrap(self) -> dict[str, Any]:
        """The engine keywords for the room (none without one)."""
        if self.bootstrap_room is None:
            return {}
        fields = {
            "bootstrap_host": self.bootstrap_host,
            "bootstrap_port": self.bootstrap_port,
            "bootstrap_room": self.bootstrap_room,
        }
        for name, value in fields.items():
            if isinstance(value, list):
                if len(value) != 1:
                    raise APIError(
                        400,
                        f"{len(value)} bootstrap rooms: a server in prefill-decode mode makes "
                        "one generation per request (n > 1 and batches are not supported there)",
                        param="n",
                    )
                fields[name] = value[0]
        return fields


class JsonSchemaFormat(_Body):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """OpenAI's `response_format`; `structural_tag` in XGrammar's shape (`format`) or SGLang's
    older one (`structures` + `triggers`)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"] = "text"
    json_schema: JsonSchemaFormat | None = None
    format: dict[str, Any] | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


class SamplingFields(BootstrapFields):
    """The sampling parameters shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    min_tokens: int = Field(default=0, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1, le=64)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    # OpenAI: token id (as a string) -> bias in [-100, 100], added to the logits
    logit_bias: dict[str, float] | None = None
    # what constrains the output (at most one; `structured.py` reads them): OpenAI's
    # response_format, vLLM's guided_* (before 0.12) and structured_outputs (0.12+), and ours
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None  # accepted, ignored: this server is the backend
    structured_outputs: dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None  # a GBNF grammar
    json_schema: dict[str, Any] | str | None = None

    def requested_model(self) -> str | None:
        """The model the client asked for. The gateway in PD mode fills a missing `model` with
        "unknown" before it adds the bootstrap room: that means none was given."""
        if self.bootstrap_room is not None and self.model == "unknown":
            return None
        return self.model

    def include_usage_chunk(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None


class FunctionDef(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class ToolCallFunction(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: dict[str, str]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class GenerateRequest(BootstrapFields):
    """Native /generate, as SGLang's `GenerateReqInput`: text or token ids (one or a batch),
    `sampling_params` (one dict, or one per prompt), logprob options, `rid`. Fields SGLang's
    frontend or the Model Gateway add that change nothing here (`lora_path`, `session_id`,
    routing keys, ...) are ignored; media inputs are refused (text-only models)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] | None = False
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = Field(default=0)
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    # reasoning models (the server's --reasoning-parser). SGLang's: `require_reasoning`, the
    # constraint starts after the reasoning (else from the first token, as SGLang does);
    # `max_thinking_tokens`, a budget after which `</think>` is forced. Ours:
    # `separate_reasoning`, the reasoning apart in `reasoning_text` (SGLang's /generate keeps the
    # raw text; its `/separate_reasoning` answers with these names)
    require_reasoning: bool = False
    max_thinking_tokens: int | None = Field(default=None, ge=0)
    separate_reasoning: bool = False


class ScoreRequest(_Body):
    """Native /score: per-token log-probs of each continuation after the prompt."""

    prompt: str | list[int]
    continuations: list[str | list[int]] = Field(min_length=1)


class ConcatAppendRequest(_Body):
    """SGLang's `/concate_and_append_request` (a KV shortcut of `join("concate_and_append")`)."""

    src_rids: list[str] = Field(default_factory=list)
    dst_rid: str | None = None


class ChatTemplateRequest(_Body):
    messages: list[dict[str, Any]] = Field(min_length=1)
    add_generation_prompt: bool = False
