"""Tool parameters as pydantic writes them: `$defs` / `definitions` and local `$ref`s, two tools
whose definitions share a name but differ, recursive refs (a tree). The constraint of every
tool-call format under every `tool_choice` and `parallel_tool_calls` accepts the valid calls
and refuses the invalid ones (walked token by token over SmolLM2's vocabulary), a tree deeper
than the regex path's unrolling goes through the context-free path in every format, and a
schema the grammar cannot say is a 400 naming the tool and the keyword under `auto` too.
Through a server, the calls parse and validate with `jsonschema`."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from runtime.server.chat import ChatRequest, answer_spec
from runtime.server.errors import APIError
from runtime.server.protocol import Tool
from runtime.server.tools.registry import get_parser
from runtime.server.tools.schemas import is_recursive

PEOPLE = {
    "type": "object",
    "properties": {"people": {"type": "array", "items": {"$ref": "#/$defs/Person"}}},
    "required": ["people"],
    "$defs": {
        "Person": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        }
    },
}
# the same definition name, another shape, draft 7's `definitions`
BADGE = {
    "type": "object",
    "properties": {"person": {"$ref": "#/definitions/Person"}},
    "required": ["person"],
    "definitions": {
        "Person": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    },
}
TREE = {
    "type": "object",
    "properties": {"root": {"$ref": "#/$defs/Node"}},
    "required": ["root"],
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
            },
            "required": ["value", "children"],
        }
    },
}
TOOLS = [
    {"type": "function", "function": {"name": "save_people", "parameters": PEOPLE}},
    {"type": "function", "function": {"name": "badge", "parameters": BADGE}},
]
SCHEMAS = {"save_people": PEOPLE, "badge": BADGE, "tree": TREE}
GOOD = [
    ("save_people", {"people": [{"name": "Ann", "age": 30}, {"name": "Bo", "age": 2}]}),
    ("badge", {"person": {"id": 7}}),
]
BAD = [
    [("badge", {"person": {"name": "Ann", "age": 30}})],  # the other tool's Person
    [("save_people", {"people": [{"id": 7}]})],
    [("save_people", {"people": [{"name": "Ann", "age": 30, "x": 1}]})],  # strict: no extras
]
FORMATS = ["json", "hermes", "llama3", "mistral", "deepseekv3", "pythonic"]
CHOICES = ["auto", "required", {"type": "function", "function": {"name": "badge"}}]


def _tree(depth: int) -> dict:
    node = {"value": depth, "children": []}
    for d in range(depth - 1, 0, -1):
        node = {"value": d, "children": [node, {"value": 0, "children": []}]}
    return {"root": node}


@pytest.fixture(scope="module")
def walk():
    """`walk(constraint, text)`: whether the engine constraint (any kind the tool path
    builds), compiled over SmolLM2's vocabulary, takes `text` token by token and accepts."""
    from grammar import compile_json_schema, compile_lark, compile_regex, compile_structural_tag
    from grammar.tokens.vocab import TokenVocabulary
    from tests.support.tiny_models import smollm_tokenizer
    from tests.support.walks import accepts_text

    tok = smollm_tokenizer()
    vocab = TokenVocabulary.from_tokenizer(tok)

    def compiled(c: dict):
        if "regex" in c:
            return compile_regex(c["regex"], vocab)
        if "structural_tag" in c:
            return compile_structural_tag(c["structural_tag"], vocab)
        if "grammar" in c:
            return compile_lark(c["grammar"], vocab)
        return compile_json_schema(c["json_schema"], vocab, json_schema_mode="strict")

    def run(constraint: dict, text: str) -> bool:
        return accepts_text(compiled(constraint), tok, text)

    return run


def _constraint(fmt: str, tools: list, choice, parallel: bool) -> dict:
    body = {"messages": [{"role": "user", "content": "u"}], "tools": tools}
    request = ChatRequest(**body, tool_choice=choice, parallel_tool_calls=parallel)
    request.prepare()
    return answer_spec(request, "strict", get_parser(fmt)).constraint


def _text(fmt: str, calls) -> str:
    if fmt == "json":  # the compact spelling its JSON-schema constraint generates
        objs = [{"name": n, "arguments": a} for n, a in calls]
        one = objs[0] if len(objs) == 1 else objs
        return json.dumps(one, separators=(",", ":"))
    return get_parser(fmt).render(calls)


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", CHOICES, ids=["auto", "required", "named"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_nested_refs_constrain_every_format_and_choice(walk, fmt, choice, parallel):
    constraint = _constraint(fmt, TOOLS, choice, parallel)
    named = isinstance(choice, dict)
    good = [c for c in GOOD if not named or c[0] == "badge"]
    for call in good:
        assert walk(constraint, _text(fmt, [call])), _text(fmt, [call])
    for bad in BAD:
        assert not walk(constraint, _text(fmt, bad)), _text(fmt, bad)
    if parallel and not named and fmt != "json":  # (json's lists are spelled ", " apart)
        assert walk(constraint, _text(fmt, GOOD))


def test_recursion_is_found():
    assert is_recursive(TREE)
    assert is_recursive({"type": "object", "properties": {"next": {"$ref": "#"}}})
    assert not is_recursive(PEOPLE) and not is_recursive(BADGE)


@pytest.mark.parametrize(
    "choice", ["auto", "required", {"type": "function", "function": {"name": "tree"}}]
)
def test_a_tree_deeper_than_the_unrolling_goes_through_the_context_free_path(walk, choice):
    tools = [{"type": "function", "function": {"name": "tree", "parameters": TREE}}]
    constraint = _constraint("json", tools, choice, False)
    assert "grammar" in constraint  # lark: no depth limit
    deep = _text("json", [("tree", _tree(6))])
    assert walk(constraint, deep)
    assert not walk(constraint, deep.replace('"children":[]', '"children":[{"value":1}]', 1))
    if choice == "auto":
        assert walk(constraint, "No call needed.")


DESCRIBED = ["qwen3_coder", "glm45", "kimi_k2", "deepseekv31", "gpt-oss"]
TREE_TOOLS = [
    {"type": "function", "function": {"name": "tree", "parameters": TREE}},
    {"type": "function", "function": {"name": "badge", "parameters": BADGE}},
]
# the root itself recursive (`"$ref": "#"`), as a linked list
CHAIN = {
    "type": "object",
    "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}},
    "required": ["value"],
}


def _chain(depth: int) -> dict:
    node: dict = {"value": depth}
    for d in range(depth - 1, 0, -1):
        node = {"value": d, "next": node}
    return node


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", CHOICES, ids=["auto", "required", "named"])
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "json"] + DESCRIBED)
def test_a_deep_tree_is_exact_in_every_format(walk, fmt, choice, parallel):
    """A depth-6 tree (deeper than the regex path's unrolling, 3) is accepted token by token
    and validates; a node without its required children is refused (the context-free path,
    under every tool_choice and parallel_tool_calls)."""
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": "tree"}}
    constraint = _constraint(fmt, TREE_TOOLS, choice, parallel)
    assert "structural_tag" in constraint
    parser = get_parser(fmt)
    deep = _text(fmt, [("tree", _tree(6))])
    assert walk(constraint, deep), deep
    _, calls = parser.parse(deep, [Tool.model_validate(t) for t in TREE_TOOLS])
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), TREE)
    bad = _tree(6)
    bad["root"]["children"][0]["children"][0]["children"][1] = {"value": 1}
    assert not walk(constraint, _text(fmt, [("tree", bad)]))
    if choice == "auto":
        assert walk(constraint, _text(fmt, [("badge", {"person": {"id": 7}})]))
        assert walk(constraint, "No call needed.")
    if parallel and choice != "auto" and not isinstance(choice, dict):
        two = [("tree", _tree(4)), ("badge", {"person": {"id": 7}})]
        assert walk(constraint, _text(fmt, two)), _text(fmt, two)


# pydantic's recursive model: the root a `$ref` into `$defs`
OUTLINE = {
    "$defs": {
        "Topic": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 12},
                "subtopics": {"type": "array", "items": {"$ref": "#/$defs/Topic"}, "maxItems": 3},
            },
            "required": ["title", "subtopics"],
        }
    },
    "$ref": "#/$defs/Topic",
}


def _outline(depth: int) -> dict:
    node: dict = {"title": f"t{depth}", "subtopics": []}
    for d in range(depth - 1, 0, -1):
        node = {"title": f"t{d}", "subtopics": [{"title": "leaf", "subtopics": []}, node]}
    return node


@pytest.mark.parametrize(
    "schema, deep, bad",
    [
        (CHAIN, _chain(6), {"value": 1, "next": {"next": {}}}),
        (OUTLINE, _outline(5), {"title": "a", "subtopics": [{"title": "b"}]}),
    ],
    ids=["ref-to-root", "root-ref"],
)
@pytest.mark.parametrize("fmt", FORMATS + DESCRIBED)
def test_a_self_referencing_root_is_exact(walk, fmt, schema, deep, bad):
    """`"$ref": "#"` (the parameters refer to themselves: a chain of 6 links), and a root that
    is a `$ref` into its `$defs` (pydantic's recursive model: an outline 5 deep)."""
    tools = [{"type": "function", "function": {"name": "deep", "parameters": schema}}]
    constraint = _constraint(fmt, tools, "required", False)
    text = _text(fmt, [("deep", deep)])
    assert walk(constraint, text), text
    parser = get_parser(fmt)
    _, calls = parser.parse(text, [Tool.model_validate(t) for t in tools])
    assert json.loads(calls[0]["function"]["arguments"]) == deep
    assert not walk(constraint, _text(fmt, [("deep", bad)]))


EXTERNAL = {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}


@pytest.mark.parametrize("fmt", ["json", "hermes", "pythonic"])
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_schema_the_grammar_cannot_say_is_400_naming_tool_and_keyword(fmt, choice):
    tools = [TOOLS[0], {"type": "function", "function": {"name": "fetch", "parameters": EXTERNAL}}]
    with pytest.raises(APIError) as err:
        _constraint(fmt, tools, choice, True)
    assert err.value.status == 400
    assert err.value.param == "tools.1.function.parameters"
    assert "'fetch'" in err.value.message and "$ref" in err.value.message


def _validate(calls) -> None:
    assert calls
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", CHOICES[1:], ids=["required", "named"])
def test_server_calls_with_nested_parameters_validate(client, model, choice, parallel):
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Save Ann, 30."}],
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        max_tokens=150,
        seed=1,
    )
    message = out.choices[0].message
    if out.choices[0].finish_reason == "tool_calls":
        _validate(message.tool_calls)
        if isinstance(choice, dict):
            assert [c.function.name for c in message.tool_calls] == ["badge"]
    else:
        assert out.choices[0].finish_reason == "length"


def test_server_refuses_an_unsayable_schema_under_auto(server):
    tools = [{"type": "function", "function": {"name": "fetch", "parameters": EXTERNAL}}]
    body = {"messages": [{"role": "user", "content": "u"}], "tools": tools, "max_tokens": 4}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "tools.0.function.parameters" and "'fetch'" in err["message"]


@pytest.fixture(scope="module", params=["pythonic", "qwen3_coder"])
def tree_client(request):
    """A server on the tiny random Qwen2 model with `--tool-call-parser` set to a
    whole-answer format and to an XML format: its calls are what the constraint lets it
    write."""
    import openai

    from tests.support.tool_servers import template_server

    srv = template_server("hermes", "--tool-call-parser", request.param)
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def test_served_tree_calls_validate_at_any_depth(tree_client):
    """A random model writing a tree through the exact constraint: every finished call
    validates, whole and streamed (its depth is whatever the model chose)."""
    model = tree_client.models.list().data[0].id
    body = {"model": model, "messages": [{"role": "user", "content": "A tree."}],
            "tools": TREE_TOOLS[:1], "tool_choice": "required", "max_tokens": 400}  # fmt: skip
    outs = [tree_client.chat.completions.create(**body, seed=seed) for seed in range(4)]
    finished = [o.choices[0].message for o in outs if o.choices[0].finish_reason == "tool_calls"]
    assert finished
    for message in finished:
        for c in message.tool_calls:
            jsonschema.validate(json.loads(c.function.arguments), TREE)
    arguments = ""
    for chunk in tree_client.chat.completions.create(**body, seed=0, stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            arguments += d.function.arguments or ""
    if outs[0].choices[0].finish_reason == "tool_calls":
        whole = outs[0].choices[0].message.tool_calls[0].function.arguments
        assert json.loads(arguments) == json.loads(whole)
