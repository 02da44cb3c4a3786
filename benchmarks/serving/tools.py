"""Tool calls and reasoning through the OpenAI API on the default model, in each model family's
call format.

Run: .venv/bin/python -m benchmarks.serving.tools [--model PATH] [--formats hermes,llama3,...]
     [--questions 4] [--concurrency 4] [--max-tokens 160] [--rows formats,nested,responses]

For each tool-call format (`json`: the model's own template with our tools text; `hermes`,
`llama3`, `mistral`, `deepseekv3`, `pythonic`: a server started with that family's template
from `examples/chat_templates/` over the default model's weights and `--tool-call-parser`),
`tool_choice` auto / required / named, and strict on / off (the tools' own `strict` flag:
off relaxes a call's arguments to any JSON object, the name stays constrained): `--questions`
chat requests (spread over 4 tools whose parameter schemas are written as LangChain writes
them). Per row: how many answers opened a call (tool_calls, or the format's call opening left
in the content), how many of those max_tokens cut before the call was complete, the share of
the finished ones that parse and validate (a known tool, arguments valid against its schema),
the share with undeclared arguments, completion tokens per call, the wall
time, and the share of prompts whose token count equals the template's own rendering of the
messages with the tools. A reasoning row: a `<think>`-opening template served with
`--reasoning-parser deepseek-r1`, `response_format` json_schema, without and with a reasoning
budget: the share of answers whose content validates after the reasoning.
Nested rows (`--rows nested`): two tools whose parameters pydantic wrote with `$defs` / `$ref`
(a team of people, a room booked for a person), strict, per format and tool_choice, judged as
above; then one recursive tool (an outline of topics holding topics: a `$ref` cycle, exact at
any depth). Responses rows (`--rows responses`, on the `json` server, the default model with no
flag): the same streamed requests through `/v1/chat/completions` and `/v1/responses`
(`tool_choice` required, nested tools), one at a time with the two APIs alternating: median
time to the first generated delta (chat: the first chunk with a call or content; Responses: the
first `response.output_item.added` / `response.output_text.delta`) and the share of calls that
validate.
Greedy decoding with `--repetition-penalty` (1.05 by default, every row alike): a 135M model at
temperature 0 can repeat a phrase inside a string argument until max_tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import jsonschema
from pydantic import BaseModel, Field

from grammar.structural.xml_args import root_object

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "examples" / "chat_templates"
FORMATS = ("json", "hermes", "llama3", "mistral", "deepseekv3", "pythonic")
TEMPLATE_OF = {"llama3": "llama3_json"}
# what shows a call was opened when it did not parse (left in the content)
OPENINGS = {
    "json": ("{", "["),
    "hermes": ("<tool_call>",),
    "llama3": ("{", "<|python_tag|>"),
    "mistral": ("[TOOL_CALLS]",),
    "deepseekv3": ("<｜tool▁calls▁begin｜>",),
    "pythonic": ("[",),
}


def _tool(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def _s(desc: str, **kw) -> dict:
    return {"type": "string", "description": desc, **kw}


TOOLS = [
    _tool(
        "get_weather",
        "Get the current weather in a city.",
        {"city": _s("The city name"), "unit": _s("Temperature unit", enum=["c", "f"])},
        ["city"],
    ),
    _tool(
        "search_flights",
        "Search flights between two cities on a date.",
        {
            "origin": _s("Departure city"),
            "destination": _s("Arrival city"),
            "date": _s("Date as YYYY-MM-DD"),
            "passengers": {"type": "integer", "description": "Number of passengers"},
        },
        ["origin", "destination", "date"],
    ),
    _tool(
        "convert_currency",
        "Convert an amount of money from one currency to another.",
        {
            "amount": {"type": "number", "description": "The amount to convert"},
            "from_currency": _s("ISO code of the source currency"),
            "to_currency": _s("ISO code of the target currency"),
        },
        ["amount", "from_currency", "to_currency"],
    ),
    _tool(
        "create_reminder",
        "Create a reminder that fires after some minutes.",
        {
            "text": _s("What to remind about"),
            "minutes": {"type": "integer", "description": "Minutes from now"},
            "priority": _s("Priority", enum=["low", "normal", "high"]),
        },
        ["text", "minutes"],
    ),
]
QUESTIONS = [
    *[f"What is the weather like in {c}?" for c in ("Paris", "Tokyo", "Oslo", "Lima")],
    *[f"Is it raining in {c} right now?" for c in ("Rome", "Cairo", "Seoul", "Quito")],
    *[f"Find me a flight from {a} to {b} on 2025-0{i + 1}-12." for i, (a, b) in
      enumerate([("Berlin", "Madrid"), ("Boston", "Denver"), ("Delhi", "Dubai"),
                 ("Sydney", "Perth")])],  # fmt: skip
    *[f"Book {n} seats from London to Nice on 2025-07-0{n}." for n in (1, 2, 3, 4)],
    *[f"Convert {a} {x} to {y}." for a, x, y in
      [(100, "USD", "EUR"), (25, "GBP", "JPY"), (9.5, "CHF", "SEK"), (1200, "INR", "USD")]],
    *[f"How many {y} is {a} {x}?" for a, x, y in
      [(50, "EUR", "USD"), (7, "CAD", "AUD"), (300, "NOK", "DKK"), (42, "BRL", "MXN")]],
    *[f"Remind me to {t} in {m} minutes." for t, m in
      [("call mom", 10), ("stretch", 30), ("check the oven", 5), ("send the report", 45)]],
    *[f"Set a high priority reminder to {t} in {m} minutes." for t, m in
      [("pay rent", 60), ("take pills", 15), ("water plants", 90), ("leave", 20)]],
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


class _Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)


class _Team(BaseModel):
    team: str = Field(max_length=20)
    members: list[_Person] = Field(min_length=1, max_length=4)


class _Room(BaseModel):
    guest: _Person
    nights: int = Field(ge=1, le=30)


class Topic(BaseModel):
    title: str = Field(max_length=20)
    subtopics: list[Topic] = Field(max_length=3)


# parameters as pydantic writes a model that holds another: `$defs` and `$ref`
NESTED_TOOLS = [
    {"type": "function", "function": {"name": "save_team", "description": "Save a team.",
                                      "parameters": _Team.model_json_schema()}},
    {"type": "function", "function": {"name": "book_room", "description": "Book a room.",
                                      "parameters": _Room.model_json_schema()}},
]  # fmt: skip
# a recursive model (a tree of topics): `$defs` with a `$ref` cycle, exact at any depth
TREE_TOOLS = [
    {"type": "function", "function": {"name": "save_outline", "description": "Save an outline.",
                                      "parameters": Topic.model_json_schema()}},
]  # fmt: skip


def judge(message: dict, fmt: str, schemas: dict | None = None) -> tuple[bool, bool, bool, int]:
    """(a call was opened, every call is valid, a call has undeclared arguments, calls)."""
    schemas = SCHEMAS if schemas is None else schemas
    calls = message.get("tool_calls") or []
    content = (message.get("content") or "").lstrip()
    if not calls:
        whole = fmt in ("json", "llama3", "pythonic")  # calls are the whole answer
        opened = any(content.startswith(o) if whole else o in content for o in OPENINGS[fmt])
        return opened, False, False, 0
    valid, extra = True, False
    for c in calls:
        schema = schemas.get(c["function"]["name"])
        try:
            args = json.loads(c["function"]["arguments"])
            jsonschema.validate(args, schema)
        except (TypeError, ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
            valid = False
            continue
        declared = root_object(schema).get("properties", {})  # (a root `$ref`: its target's)
        extra = extra or bool(set(args) - set(declared))
    return True, valid, extra, len(calls)


def _tools(strict: bool) -> list[dict]:
    return [{**t, "function": {**t["function"], "strict": strict}} for t in TOOLS]


def _choice(kind: str, question_index: int, tools: list[dict] = TOOLS) -> str | dict:
    if kind != "named":
        return kind
    name = tools[question_index * len(tools) // len(QUESTIONS)]["function"]["name"]
    return {"type": "function", "function": {"name": name}}


def _questions(n: int) -> list[tuple[int, str]]:
    """`n` questions spread evenly over the tools."""
    step = max(1, len(QUESTIONS) // n)
    return [(i, QUESTIONS[i]) for i in range(0, len(QUESTIONS), step)][:n]


async def run_row(
    srv: dict, fmt: str, kind: str, strict: bool, args, tools: list[dict] | None = None,
    label: str = "nested $defs",
) -> dict:  # fmt: skip
    sem = asyncio.Semaphore(args.concurrency)
    rows: list[tuple[bool, bool, bool, int, int, bool, bool]] = []
    nested = tools is not None
    tools = _tools(strict) if tools is None else tools
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}

    async def one(http: httpx.AsyncClient, i: int, question: str) -> None:
        messages = [{"role": "user", "content": question}]
        body = {
            "model": srv["model"],
            "messages": messages,
            "tools": tools,
            "tool_choice": _choice(kind, i, tools),
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "repetition_penalty": args.repetition_penalty,
        }
        async with sem:
            r = await http.post(f"{srv['url']}/v1/chat/completions", json=body)
        r.raise_for_status()
        out = r.json()
        opened, valid, extra, n = judge(out["choices"][0]["message"], fmt, schemas)
        same = out["usage"]["prompt_tokens"] == srv["prompt_tokens"](messages, tools)
        cut = opened and not valid and out["choices"][0]["finish_reason"] == "length"
        rows.append((opened, valid, extra, n, out["usage"]["completion_tokens"], same, cut))

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=900) as http:
        await asyncio.gather(*(one(http, i, q) for i, q in _questions(args.questions)))
    wall = time.perf_counter() - started
    cut = sum(r[6] for r in rows)  # a call max_tokens ended before it was complete
    opened = [r for r in rows if r[0] and not r[6]]
    calls = sum(r[3] for r in rows)
    return {
        "format": f"{fmt} ({label})" if nested else fmt,
        "tool_choice": kind,
        "strict": "on" if strict else "off",
        "answers": len(rows),
        "opened": len(opened) + cut,
        "cut": cut,
        "valid": sum(r[1] for r in opened) / len(opened) if opened else float("nan"),
        "extra": sum(r[2] for r in opened) / len(opened) if opened else float("nan"),
        # over the answers that hold calls (an auto answer of plain text is not a call's cost)
        "tokens_per_call": sum(r[4] for r in rows if r[3]) / calls if calls else float("nan"),
        "wall": wall,
        "prompt_same": sum(r[5] for r in rows) / len(rows),
    }


ANSWER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "answer": {"type": "string",
                   "maxLength": 60}},
    "required": ["city", "answer"],
}  # fmt: skip


async def run_reasoning(srv: dict, budget: int | None, args) -> dict:
    sem = asyncio.Semaphore(args.concurrency)
    rows: list[tuple[bool, bool]] = []
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}

    async def one(http: httpx.AsyncClient, question: str) -> None:
        body = {"model": srv["model"], "messages": [{"role": "user", "content": question}],
                "response_format": fmt, "max_tokens": args.max_tokens + (budget or 0),
                "temperature": 0, "repetition_penalty": args.repetition_penalty}  # fmt: skip
        if budget is not None:
            body["max_reasoning_tokens"] = budget
        async with sem:
            r = await http.post(f"{srv['url']}/v1/chat/completions", json=body)
        r.raise_for_status()
        message = r.json()["choices"][0]["message"]
        try:
            jsonschema.validate(json.loads(message.get("content") or ""), ANSWER)
            ok = True
        except (ValueError, jsonschema.ValidationError):
            ok = False
        rows.append((ok, "</think>" not in (message.get("content") or "")))

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=900) as http:
        await asyncio.gather(*(one(http, q) for _, q in _questions(args.questions)))
    return {
        "budget": budget,
        "answers": len(rows),
        "valid": sum(r[0] for r in rows) / len(rows),
        "apart": sum(r[1] for r in rows) / len(rows),
        "wall": time.perf_counter() - started,
    }


async def _first_event_chat(http: httpx.AsyncClient, srv: dict, body: dict) -> tuple[float, list]:
    """Streamed chat completion: (seconds to the first generated delta, the calls)."""
    started, ttft, calls = time.perf_counter(), None, {}
    async with http.stream("POST", f"{srv['url']}/v1/chat/completions",
                           json={**body, "stream": True}) as r:  # fmt: skip
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                if ttft is None and (delta.get("tool_calls") or delta.get("content")):
                    ttft = time.perf_counter() - started
                for c in delta.get("tool_calls") or []:
                    call = calls.setdefault(c["index"], {"name": "", "arguments": ""})
                    call["name"] += c.get("function", {}).get("name") or ""
                    call["arguments"] += c.get("function", {}).get("arguments") or ""
    return ttft if ttft is not None else float("nan"), list(calls.values())


async def _first_event_responses(
    http: httpx.AsyncClient, srv: dict, body: dict
) -> tuple[float, list]:
    """Streamed Responses request: (seconds to the first generated item event, the calls)."""
    started, ttft, calls = time.perf_counter(), None, []
    firsts = ("response.output_item.added", "response.output_text.delta")
    async with http.stream("POST", f"{srv['url']}/v1/responses",
                           json={**body, "stream": True}) as r:  # fmt: skip
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if ttft is None and event["type"] in firsts:
                ttft = time.perf_counter() - started
            if event["type"] in ("response.completed", "response.incomplete"):
                calls = [o for o in event["response"]["output"] if o["type"] == "function_call"]
    return ttft if ttft is not None else float("nan"), calls


async def run_apis(srv: dict, args) -> list[dict]:
    """Chat completions and the Responses API on the same streamed requests (nested tools,
    `tool_choice` required), one request at a time, the two APIs alternating which goes
    first: time to first token and the share of calls that validate."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in NESTED_TOOLS}
    flat = [{"type": "function", **t["function"]} for t in NESTED_TOOLS]
    out = {api: {"ttft": [], "calls": 0, "valid": 0} for api in ("chat", "responses")}
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.api_requests)]
    async with httpx.AsyncClient(timeout=900) as http:
        for i, question in enumerate([questions[0], *questions]):  # the first pair warms up
            common = {"model": srv["model"], "temperature": 0, "tool_choice": "required",
                      "repetition_penalty": args.repetition_penalty}  # fmt: skip
            # a request number in each question: no request finds the other API's prompt in
            # the radix cache (both prefill their question; the tools' text stays cached)
            asked = {
                api: f"({2 * i + k}) {question}" for k, api in enumerate(("chat", "responses"))
            }
            bodies = {
                "chat": {**common, "messages": [{"role": "user", "content": asked["chat"]}],
                         "tools": NESTED_TOOLS, "max_tokens": args.max_tokens},
                "responses": {**common, "input": asked["responses"], "tools": flat,
                              "max_output_tokens": args.max_tokens},
            }  # fmt: skip
            send = {"chat": _first_event_chat, "responses": _first_event_responses}
            for api in ("chat", "responses") if i % 2 == 0 else ("responses", "chat"):
                ttft, calls = await send[api](http, srv, bodies[api])
                if i == 0:
                    continue
                out[api]["ttft"].append(ttft)
                for c in calls:
                    out[api]["calls"] += 1
                    try:
                        jsonschema.validate(json.loads(c["arguments"]), schemas[c["name"]])
                        out[api]["valid"] += 1
                    except (KeyError, ValueError, jsonschema.ValidationError):
                        pass
    rows = []
    for api, r in out.items():
        ttfts = sorted(t for t in r["ttft"] if t == t)
        median = ttfts[len(ttfts) // 2] if ttfts else float("nan")
        rows.append({"api": api, "answers": len(r["ttft"]), "calls": r["calls"],
                     "valid": r["valid"] / r["calls"] if r["calls"] else float("nan"),
                     "ttft_median": median})  # fmt: skip
    chat = rows[0]["ttft_median"]
    for row in rows:
        row["ttft_ratio"] = row["ttft_median"] / chat if chat else float("nan")
    return rows


def start(model: str, flags: list[str], args) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "runtime.server", "--port", str(port), "--model", model,
           "--log-level", "warning", *flags]  # fmt: skip
    if args.num_threads:
        cmd += ["--num-threads", str(args.num_threads)]
    log = tempfile.NamedTemporaryFile(prefix="bench-tools-", suffix=".log", delete=False)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited: {Path(log.name).read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("server did not start")


def _prompt_counter(model: str, template: str | None):
    """The token count of the template's own rendering of `messages` with `tools`. The model's
    own template (`template` None, the `json` format) cannot render tools: there the reference
    is that template's rendering with our tools text as the system turn (as documented)."""
    from transformers import AutoTokenizer

    from runtime.server.protocol import Tool
    from runtime.server.tools.prompt import tools_system_text

    tok = AutoTokenizer.from_pretrained(model)
    if template is not None:
        tok.chat_template = template

    def count(messages: list[dict], tools: list[dict]) -> int:
        if template is None:
            text = tools_system_text([Tool.model_validate(t) for t in tools])
            messages = [{"role": "system", "content": text}, *messages]
            ids = tok.apply_chat_template(messages, add_generation_prompt=True)
        else:
            ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # BatchEncoding in v5

    return count


# a conversation with a tool-call turn and its result (templates that render tool calls)
HISTORY_CALL = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip
HISTORY = [
    {"role": "user", "content": "What is the weather like in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [HISTORY_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 4}'},
]


def _template_history(messages: list[dict]) -> list[dict]:
    """The history as a template reads it: arguments as an object (all our templates write
    them with `tojson` but DeepSeek's, which prints the JSON text as given)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "function": {**c["function"],
                                        "arguments": json.loads(c["function"]["arguments"])}}
                     for c in m["tool_calls"]]  # fmt: skip
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


async def history_prompt_same(srv: dict, fmt: str) -> bool | None:
    """Whether the prompt of a conversation with a tool-call history has the token count of the
    template's own rendering (None for `json`: its template cannot render tool calls)."""
    if fmt == "json":
        return None
    body = {"model": srv["model"], "messages": HISTORY, "tools": _tools(True),
            "max_tokens": 1, "temperature": 0}  # fmt: skip
    async with httpx.AsyncClient(timeout=900) as http:
        r = await http.post(f"{srv['url']}/v1/chat/completions", json=body)
    r.raise_for_status()
    history = HISTORY if fmt == "deepseekv3" else _template_history(HISTORY)
    return r.json()["usage"]["prompt_tokens"] == srv["prompt_tokens"](history, _tools(True))


def serve(model: str, fmt: str, args, flags: list[str] | None = None):
    template = None
    flags = list(flags or [])
    if fmt != "json":
        path = TEMPLATES / f"{TEMPLATE_OF.get(fmt, fmt)}.jinja"
        template = path.read_text()
        flags += ["--chat-template", str(path)]
        if fmt != "think":
            flags += ["--tool-call-parser", fmt]
    proc, url = start(model, flags, args)
    name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    return proc, {"url": url, "model": name, "prompt_tokens": _prompt_counter(model, template)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--questions", type=int, default=4, help="requests per row")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--api-requests", type=int, default=16, help="per API, responses rows")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.05)
    p.add_argument("--no-reasoning", action="store_true")
    p.add_argument("--strict", default="on,off", help="strict rows to run: on, off or both")
    p.add_argument("--choices", default="auto,required,named", help="tool_choice rows to run")
    p.add_argument(
        "--rows",
        default="formats,nested,responses",
        help="which rows: formats (the 4 flat tools per format), nested (pydantic tools with "
        "$defs, strict, per format), responses (the Responses API beside chat completions, "
        "json format)",
    )
    p.add_argument(
        "--off-formats",
        default=None,
        help="formats that also get the strict-off rows (default: every format)",
    )
    args = p.parse_args()
    from runtime.default_model import ensure_default_model

    model = args.model or str(ensure_default_model())
    results, reasoning, apis = [], [], []
    rows = set(args.rows.split(","))
    for fmt in filter(None, args.formats.split(",")):
        proc, srv = serve(model, fmt, args)
        try:
            results += _format_rows(srv, fmt, rows, args)
            if "responses" in rows and fmt == "json":
                apis = asyncio.run(run_apis(srv, args))
                print(apis, flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
    if not args.no_reasoning:
        proc, srv = serve(model, "think", args, ["--reasoning-parser", "deepseek-r1"])
        try:
            for budget in (None, 32):
                reasoning.append(asyncio.run(run_reasoning(srv, budget, args)))
        finally:
            proc.terminate()
            proc.wait(60)
    report(results, reasoning, args)
    report_apis(apis, args)


def _format_rows(srv: dict, fmt: str, rows: set[str], args) -> list[dict]:
    """One format's rows: the flat tools per tool_choice and strict setting, then the nested
    tools (strict) per tool_choice."""
    out = []
    history = asyncio.run(history_prompt_same(srv, fmt)) if "formats" in rows else None
    for kind in args.choices.split(","):
        if "formats" in rows:
            for strict in _strict_rows(fmt, args):
                out.append(asyncio.run(run_row(srv, fmt, kind, strict, args)))
                out[-1]["history_same"] = history
                print(out[-1], flush=True)
        if "nested" in rows:
            out.append(asyncio.run(run_row(srv, fmt, kind, True, args, NESTED_TOOLS)))
            print(out[-1], flush=True)
            tree = asyncio.run(run_row(srv, fmt, kind, True, args, TREE_TOOLS, "recursive $defs"))
            out.append(tree)
            print(tree, flush=True)
    return out


def report_apis(apis: list[dict], args) -> None:
    if not apis:
        return
    print(f"\nstreamed, tool_choice required, nested tools, {args.api_requests} requests each "
          "(after one warm-up pair), one at a time, the APIs alternating\n")  # fmt: skip
    print("| API | answers | calls | calls valid | median time to first token s | vs chat |")
    print("|---|---|---|---|---|---|")
    for r in apis:
        print(f"| {r['api']} | {r['answers']} | {r['calls']} | {_pct(r['valid'])} "
              f"| {r['ttft_median']:.3f} | {r['ttft_ratio']:.2f}x |")  # fmt: skip


def _strict_rows(fmt: str, args) -> list[bool]:
    rows = [s == "on" for s in args.strict.split(",")]
    if args.off_formats is not None and fmt not in args.off_formats.split(","):
        rows = [r for r in rows if r]
    return rows


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:.0%}"  # NaN: no call was opened


def _num(x: float) -> str:
    return "-" if x != x else f"{x:.1f}"


def report(results: list[dict], reasoning: list[dict], args) -> None:
    print(f"\n{args.questions} requests per row, {len(TOOLS)} tools ({len(NESTED_TOOLS)} in the "
          f"nested rows), greedy, repetition_penalty "
          f"{args.repetition_penalty}, max_tokens {args.max_tokens}\n")  # fmt: skip
    print("| format | tool_choice | strict | answers that opened a call | cut by max_tokens "
          "| finished calls valid | with undeclared args | completion tokens per call | wall s "
          "| prompt = template | with a tool-call history |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        history = {None: "n/a", True: "yes", False: "NO"}[r.get("history_same")]
        head = f"| {r['format']} | {r['tool_choice']} | {r['strict']} "
        print(f"{head}| {r['opened']}/{r['answers']} | {r['cut']} | {_pct(r['valid'])} "
              f"| {_pct(r['extra'])} | {_num(r['tokens_per_call'])} | {r['wall']:.1f} "
              f"| {r['prompt_same']:.0%} | {history} |")  # fmt: skip
    if reasoning:
        print(
            "\n| reasoning (deepseek-r1 format, response_format) | answers | content validates "
            "| no </think> in content | wall s |"
        )
        print("|---|---|---|---|---|")
        for r in reasoning:
            label = "no budget" if r["budget"] is None else f"max_reasoning_tokens {r['budget']}"
            print(f"| {label} | {r['answers']} | {r['valid']:.0%} | {r['apart']:.0%} "
                  f"| {r['wall']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
