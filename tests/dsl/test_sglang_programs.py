"""SGLang's frontend test programs, unchanged but for `import sgl_dsl as sgl`, on the in-process
runtime and on a `RuntimeEndpoint` (examples/sglang_programs.py holds them and their checks).

A random tiny model answers nonsense, so the checks are structural only (variables, types, JSON,
regexes, messages); the heavy run on the default model runs one program of each kind and
prints its factual answers.
"""

from __future__ import annotations

import pytest

import sgl_dsl as sgl
from examples.sglang_programs import PROGRAMS
from tests.support.dsl_backends import DEFAULT_MODEL_BUDGET, ENGINE_KWARGS, ON_THE_DEFAULT_MODEL
from tests.support.server_process import shared_server, tiny_model_dir


@pytest.fixture(scope="module")
def runtime():
    backend = sgl.Runtime(str(tiny_model_dir()), mem_budget_gb=0.25, num_threads=1)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def endpoint():
    backend = sgl.RuntimeEndpoint(shared_server().url)
    yield backend
    backend.shutdown()


@pytest.fixture
def use(request):
    def set_backend(backend):
        sgl.set_default_backend(backend)
        return backend

    yield set_backend
    sgl.set_default_backend(None)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_in_process(name, runtime, use):
    use(runtime)
    PROGRAMS[name](sgl)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_on_endpoint(name, endpoint, use):
    use(endpoint)
    PROGRAMS[name](sgl)


def test_constraint_cut_by_the_budget_returns_its_text(runtime, endpoint):
    @sgl.function
    def prog(s):
        s += "Digits: " + sgl.gen("d", max_tokens=3, regex="[0-9]{40}", temperature=0)

    for backend in (runtime, endpoint):
        state = prog.run(backend=backend)
        meta = state.get_meta_info("d")
        assert meta["finish_reason"]["type"] == "length" and meta["finish_reason"] == "length"
        assert state["d"].isdigit() and meta["completion_tokens"] == 3


def test_logprobs_in_sglang_shape(runtime, endpoint):
    @sgl.function
    def prog(s):
        s += "Once upon a time" + sgl.gen(
            "x",
            max_tokens=3,
            temperature=0,
            return_logprob=True,
            logprob_start_len=0,
            top_logprobs_num=2,
            return_text_in_logprobs=True,
        )

    metas = [prog.run(backend=b).get_meta_info("x") for b in (runtime, endpoint)]
    for meta in metas:
        out = meta["output_token_logprobs"]
        assert len(out) == 3 and all(isinstance(t[1], int) and isinstance(t[2], str) for t in out)
        assert meta["logprobs"] == [t[0] for t in out]
        assert [len(top) for top in meta["output_top_logprobs"]] == [2, 2, 2]
        inputs = meta["input_token_logprobs"]
        assert inputs[0][0] is None and len(inputs) == meta["prompt_tokens"]
    a, b = metas
    assert [t[1] for t in a["output_token_logprobs"]] == [t[1] for t in b["output_token_logprobs"]]
    assert [t[0] for t in a["input_token_logprobs"][1:]] == pytest.approx(
        [t[0] for t in b["input_token_logprobs"][1:]], abs=1e-3
    )


def test_n_and_stop_regex_on_a_real_engine(runtime, endpoint):
    @sgl.function
    def prog(s):
        s += "Count:" + sgl.gen("many", 4, None, 3, temperature=1.0)
        s += "\nMore:" + sgl.gen("cut", max_tokens=24, stop_regex=r"[aeiou]", temperature=0)

    for backend in (runtime, endpoint):
        state = prog.run(backend=backend)
        many = state["many"]
        assert isinstance(many, list) and len(many) == 3
        assert ("Count:" + many[0] + "\nMore:") in state.text()
        meta = state.get_meta_info("cut")
        if meta["finish_reason"]["type"] == "stop" and meta["matched_stop"]:
            assert meta["matched_stop"] in "aeiou"
        assert not any(v in state["cut"] for v in "aeiou")


def test_flush_cache_and_server_info(runtime, endpoint, use):
    for backend in (runtime, endpoint):
        use(backend)
        assert sgl.global_config.default_backend is backend
        assert "model_path" in sgl.get_server_info()
        assert isinstance(sgl.flush_cache(), bool)


@pytest.mark.heavy
def test_programs_on_the_default_model(use, capsys):
    backend = use(sgl.Runtime(**ENGINE_KWARGS))
    try:
        answers = {
            name: PROGRAMS[name](sgl, budget=DEFAULT_MODEL_BUDGET) for name in ON_THE_DEFAULT_MODEL
        }
    finally:
        backend.shutdown()
    with capsys.disabled():
        for name, facts in answers.items():
            print(f"\n[sgl_dsl, default model] {name}: {facts}")
