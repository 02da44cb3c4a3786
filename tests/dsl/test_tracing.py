"""Tracing: the IR a program becomes, its printed form, misuse errors, the constant prefix."""

from __future__ import annotations

import pytest

import sgl_dsl as sgl
from sgl_dsl.compiler import constant_prefix_length, prefix_text
from sgl_dsl.ir import Append, ArgRef, Fork, GetForkItem, Join, RoleBegin, Text
from tests.support.dsl_backends import FakeBackend


@sgl.function
def qa(s, question, context):
    s += sgl.system("You answer questions.")
    with s.user():
        s += "Context: " + context + "\nQ: " + question
    s += sgl.assistant(sgl.gen("answer", max_tokens=32, stop="\n"))
    forks = s.fork(2)
    for f in forks:
        f += "Check: " + sgl.select("ok", ["yes", "no"])
    forks.join()
    s += "Again: " + s["answer"]


EXPECTED_IR = """\
program qa(question, context)
  %0 += role_begin system
  %0 += text 'You answer questions.'
  %0 += role_end system
  %0 += role_begin user
  %0 += text 'Context: '
  %0 += arg context
  %0 += text '\\nQ: '
  %0 += arg question
  %0 += role_end user
  %0 += role_begin assistant
  %0 += gen answer(max_tokens=32, stop=['\\n'])
  %0 += role_end assistant
  %fork0 = fork %0 n=2
  %1 = get_fork_item %fork0[0]
  %2 = get_fork_item %fork0[1]
  %1 += text 'Check: '
  %1 += select ok(['yes', 'no'], method=token_length_normalized)
  %2 += text 'Check: '
  %2 += select ok(['yes', 'no'], method=token_length_normalized)
  join %fork0 into %0
  %0 += text 'Again: '
  %0 += var answer"""


def test_ir_prints():
    assert str(qa.trace()) == EXPECTED_IR


def test_ir_nodes():
    program = qa.trace()
    assert program.arg_names == ["question", "context"]
    st = program.statements
    assert st[0] == Append("%0", RoleBegin("system"))
    assert st[5] == Append("%0", ArgRef("context"))
    assert st[12] == Fork("%0", "%fork0", 2)
    assert st[13] == GetForkItem("%fork0", 0, "%1")
    assert st[19] == Join("%fork0", "%0")


def test_bound_arguments_are_traced_as_constants():
    program = qa.trace(context="Sky is blue.")
    assert program.arg_names == ["question"]
    assert Append("%0", Text("Context: Sky is blue.\nQ: ")) in program.statements


def _fstring(s, q):
    s += f"Q: {q}"


def _str(s, q):
    s += "Q: " + str(q)


def _compare(s, q):
    if q == "yes":
        s += "!"


def _if(s, q):
    if q:
        s += "!"


def _method(s, q):
    s += q.strip()


def _percent(s, q):
    s += "Q: %s" % q  # noqa: UP031


def _var_compare(s, q):
    s += sgl.gen("a")
    if s["a"] == "yes":
        s += q


@pytest.mark.parametrize(
    ("body", "what", "how"),
    [
        pytest.param(_fstring, "argument 'q'", "f-string", id="f-string"),
        pytest.param(_str, "argument 'q'", r"str\(\)", id="str"),
        pytest.param(_compare, "argument 'q'", "comparison", id="comparison"),
        pytest.param(_if, "argument 'q'", "condition", id="if"),
        pytest.param(_method, "argument 'q'", r"\.strip", id="method"),
        pytest.param(_percent, "argument 'q'", r"str\(\)", id="percent-format"),
        pytest.param(_var_compare, "variable 'a'", "comparison", id="variable"),
    ],
)
def test_misuse_while_tracing_names_the_value(body, what, how):
    with pytest.raises(sgl.TraceError, match=f"{what}.* was used .*{how}"):
        sgl.function(body).trace()


def test_misused_program_still_runs():
    state = sgl.function(_fstring).run(q="hi", backend=FakeBackend())
    assert state.text() == "Q: hi"


def test_constant_prefix_stops_at_the_first_argument():
    program = qa.trace()
    assert constant_prefix_length(program) == 5
    text = prefix_text(program, FakeBackend())
    assert (
        text == "<|im_start|>system\nYou answer questions.<|im_end|>\n<|im_start|>user\nContext: "
    )


def test_prefix_of_an_untraceable_program_is_what_came_before():
    @sgl.function
    def prog(s, q):
        s += "Header.\n"
        s += f"Q: {q}"

    assert prog.prefix(FakeBackend()) == "Header.\n"


def test_protocol_probes_on_a_placeholder_are_not_misuse():
    from sgl_dsl.tracer import argument

    q = argument("q")
    assert not hasattr(q, "__array__")
    assert "argument 'q'" in repr(q)
