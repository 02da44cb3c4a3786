"""Pure-frontend behaviour on a scripted fake backend: roles, messages, vars, forks, streams."""

from __future__ import annotations

import json

import pytest

import sgl_dsl as sgl
from tests.support.dsl_backends import FakeBackend


@sgl.function
def chat(s, question):
    s += sgl.system("Be brief.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


def test_role_expressions_give_messages():
    backend = FakeBackend({"assistant\n": "Paris."})
    state = chat.run(question="Capital of France?", backend=backend)
    assert state.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]
    assert state["answer"] == "Paris."
    assert state.text() == backend.chat_template().begin("system") + "Be brief.<|im_end|>\n" + (
        "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>\n"
    )


def test_role_blocks_without_system_get_the_template_default():
    @sgl.function
    def blocks(s, q):
        with s.user():
            s += "Q: " + q
        with s.assistant():
            s += sgl.gen("a")

    backend = FakeBackend({"assistant\n": "A."})
    state = blocks.run(q="hi", backend=backend)
    tok = backend.chat_template()
    assert state.messages() == [
        {"role": "system", "content": "Default system."},
        {"role": "user", "content": "Q: hi"},
        {"role": "assistant", "content": "A."},
    ]
    assert tok.default_system == "Default system."
    # the text is exactly what the tokenizer's own template renders for these messages
    from tests.support.dsl_backends import ChatMLTokenizer

    assert state.text() == ChatMLTokenizer().apply_chat_template(state.messages())


def test_nested_role_block_is_an_error():
    @sgl.function
    def bad(s):
        with s.user():
            s += sgl.assistant("no")

    with pytest.raises(sgl.ProgramError, match="inside the open user block"):
        bad.run(backend=FakeBackend())


def test_gen_params_reach_the_backend():
    @sgl.function
    def prog(s):
        s += "n=" + sgl.gen("n", max_tokens=4, stop="\n", dtype=int, temperature=0)
        s += sgl.gen("j", json_schema={"type": "object"})

    backend = FakeBackend({"n=": "42"})
    state = prog.run(backend=backend, temperature=0.5, max_new_tokens=9)
    first, second = [c[2] for c in backend.calls if c[0] == "generate"]
    assert first == {"max_tokens": 4, "stop": ["\n"], "dtype": "int", "temperature": 0}
    assert second == {"max_tokens": 9, "temperature": 0.5, "json_schema": '{"type":"object"}'}
    assert state["n"] == "42" and isinstance(state["n"], str)
    assert state.get_meta_info("n")["finish_reason"] == "stop"


def test_pydantic_and_json_text_schemas_become_json_text():
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    from_class = sgl.gen("p", json_schema=Person).params["json_schema"]
    assert json.loads(from_class)["required"] == ["name", "age"]
    assert sgl.gen("p", json_schema='{"type": "string"}').params["json_schema"]
    with pytest.raises(sgl.ProgramError, match="at most one"):
        sgl.gen("p", regex="a+", dtype=int)
    with pytest.raises(sgl.ProgramError, match="dtype"):
        sgl.gen("p", dtype=list)


@pytest.mark.parametrize(
    ("method", "scores", "expected"),
    [
        pytest.param("token_length_normalized", {"True": -1.0, "False": -2.0}, "True", id="mean"),
        pytest.param("greedy", {"True": -3.0, "False": -0.5}, "False", id="greedy"),
        pytest.param(
            "unconditional_likelihood_normalized", {"Unknown": -0.1}, "Unknown", id="uncond"
        ),
        pytest.param(lambda sc: len(sc.choices) - 1, {}, "Unknown", id="user-callable"),
    ],
)
def test_select_methods(method, scores, expected):
    @sgl.function
    def prog(s):
        s += "Answer: " + sgl.select("v", ["True", "False", "Unknown"], method=method)

    backend = FakeBackend(scores=scores)
    state = prog.run(backend=backend)
    assert state["v"] == expected
    assert state.text() == "Answer: " + expected
    scored = [c for c in backend.calls if c[0] == "score"]
    # one batched call with every choice (plus one unconditional call for that method)
    assert scored[0][1] == "Answer:"  # the trailing space moved into the choices
    assert scored[0][2] == [" True", " False", " Unknown"]
    assert len(scored) == (2 if method == "unconditional_likelihood_normalized" else 1)


def test_user_defined_select_method_class():
    class Shortest(sgl.SelectMethod):
        name = "shortest"

        def __call__(self, scores):
            return min(range(len(scores.choices)), key=lambda i: len(scores.choices[i]))

    @sgl.function
    def prog(s):
        s += sgl.select("v", ["long one", "s", "medium"], method=Shortest())

    assert prog.run(backend=FakeBackend())["v"] == "s"


def test_fork_join_gathers_variables_in_fork_order():
    @sgl.function
    def tree(s):
        s += "Q: why?\n"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Path {i}: " + sgl.gen("idea", max_tokens=4)
        forks.join()
        s += "Best: " + sgl.gen("best")

    backend = FakeBackend({"Path 0: ": "zero", "Path 1: ": "one", "Path 2: ": "two"})
    state = tree.run(backend=backend)
    assert state["idea"] == ["zero", "one", "two"]
    assert state.text() == "Q: why?\nBest: x"
    commits = [c[1] for c in backend.calls if c[0] == "commit"]
    assert commits == ["Q: why?\n"]  # the shared prefix went into the cache first


def test_fork_on_an_empty_state_commits_and_works():
    @sgl.function
    def prog(s):
        forks = s.fork(2)
        for f in forks:
            f += sgl.gen("g")
        forks.join()

    backend = FakeBackend()
    assert prog.run(backend=backend)["g"] == ["x", "x"]
    assert ("commit", "", None) in backend.calls


def test_error_in_a_fork_fails_the_program_at_join():
    @sgl.function
    def prog(s):
        forks = s.fork(2)
        forks[1] += sgl.assistant("a") + sgl.user("b")
        forks[1] += sgl.system(sgl.system("nested"))
        forks.join()

    with pytest.raises(sgl.ProgramError, match="inside the open system block"):
        prog.run(backend=FakeBackend())


def test_var_scope_and_nested_function():
    @sgl.function
    def greet(s, who):
        s += "Hello " + who + ". "

    @sgl.function
    def prog(s, who):
        with s.var_scope("greeting"):
            greet(s, who)
        s += s["greeting"].upper()

    state = prog.run(who="Ann", backend=FakeBackend())
    assert state["greeting"] == "Hello Ann. "
    assert state.text() == "Hello Ann. HELLO ANN. "


def test_batch_reports_each_error_on_its_own_state():
    @sgl.function
    def prog(s, n):
        s += "n=" + str(n)
        if n == 2:
            raise ValueError("two is bad")
        s += sgl.gen("g")

    backend = FakeBackend()
    states = prog.run_batch([{"n": i} for i in range(4)], backend=backend, num_threads=2)
    assert [s.error is None for s in states] == [True, True, False, True]
    assert isinstance(states[2].error, ValueError)
    assert [s.text() for s in states] == ["n=0x", "n=1x", "n=2", "n=3x"]


def test_run_batch_prefills_the_constant_prefix_once():
    @sgl.function
    def prog(s, q):
        s += sgl.system("Shared instructions.")
        s += sgl.user("Q: " + q)
        s += sgl.assistant(sgl.gen("a"))

    backend = FakeBackend()
    states = prog.run_batch([{"q": str(i)} for i in range(5)], backend=backend)
    commits = [c[1] for c in backend.calls if c[0] == "commit"]
    assert commits == ["<|im_start|>system\nShared instructions.<|im_end|>\n<|im_start|>user\nQ: "]
    assert all(s.text().startswith(commits[0]) for s in states)


def test_stream_text_iter():
    @sgl.function
    def prog(s):
        s += "A: " + sgl.gen("a") + "\nB: " + sgl.gen("b")

    backend = FakeBackend({"A: ": "hello", "B: ": "world"})
    state = prog.run(backend=backend, stream=True)
    assert "".join(state.text_iter("a")) == "hello"
    assert "".join(state.text_iter()) == "A: hello\nB: world"
    assert state["b"] == "world"


def test_stream_reports_the_error_at_the_end():
    @sgl.function
    def prog(s):
        s += "A: " + sgl.gen("a")
        raise RuntimeError("boom")

    state = prog.run(backend=FakeBackend(), stream=True)
    with pytest.raises(RuntimeError, match="boom"):
        list(state.text_iter())
    assert state.text() == "A: x"


def test_missing_backend_and_direct_call_errors():
    sgl.set_default_backend(None)
    with pytest.raises(sgl.NoBackendError):
        chat.run(question="q")
    with pytest.raises(sgl.ProgramError, match=r"chat\.run"):
        chat("not a state", "q")


def test_no_prefix_commits_on_a_backend_without_a_cache():
    @sgl.function
    def prog(s, q):
        s += "Shared header. " + q
        forks = s.fork(2)
        forks.join()

    backend = FakeBackend()
    backend.has_prefix_cache = False
    prog.run_batch([{"q": "a"}, {"q": "b"}], backend=backend)
    assert [c for c in backend.calls if c[0] == "commit"] == []


def test_http_backend_is_exported_lazily():
    from sgl_dsl.backend.endpoint import RuntimeEndpoint

    assert sgl.RuntimeEndpoint is RuntimeEndpoint
    assert issubclass(sgl.Runtime, sgl.Backend) and issubclass(RuntimeEndpoint, sgl.Backend)


def test_run_batch_shows_a_progress_bar(capsys):
    @sgl.function
    def prog(s, q):
        s += q + sgl.gen("g")

    prog.run_batch([{"q": str(i)} for i in range(3)], backend=FakeBackend(), progress_bar=True)
    assert "3/3" in capsys.readouterr().err


def test_runtime_adapter_speaks_the_engines_names():
    from sgl_dsl.backend.runtime import _engine_kwargs

    params = sgl.gen("g", max_tokens=5, min_tokens=1, return_logprob=True, dtype=int).params
    assert _engine_kwargs(params) == {
        "max_new_tokens": 5,
        "min_new_tokens": 1,
        "logprobs": True,
        "dtype": "int",  # the engine takes the name (grammar.DTYPE_NAMES), as over HTTP
    }


def test_reading_a_streaming_state_waits_for_the_program():
    @sgl.function
    def prog(s):
        s += "A: " + sgl.gen("a") + "\nB: " + sgl.gen("b")
        s += "\nlen=" + str(len(s["a"]))  # the program's own reads never wait on itself

    backend = FakeBackend({"A: ": "hello", "B: ": "world"})
    state = prog.run(backend=backend, stream=True)
    assert state["b"] == "world"  # waits until the background program has set it
    assert state.text() == "A: hello\nB: world\nlen=5"
    assert state.get_meta_info("a")["finish_reason"] == "stop"
