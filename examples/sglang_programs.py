"""SGLang's frontend test programs (`sglang/test/test_programs.py`), in our words.

Every program takes the frontend module as `sgl`, so the same code runs with `import sgl_dsl as
sgl` (on the in-process `Runtime` or a `RuntimeEndpoint`) and with `import sglang as sgl` (the
real SGLang frontend, against `python -m runtime.server`). Each `run_*` makes the structural
checks a program must pass on any model (variables present, types, JSON that parses, regexes
that match, message counts) and returns the model's factual answers, which are reported apart
and never asserted: a random test model answers nonsense, the default model often does too.

A constrained gen that runs out of tokens returns its text with finish_reason "length" (as
SGLang does); checks that need the whole value are made only when the gen ended on its own.

    python -m examples.sglang_programs                 # all programs, sgl_dsl in-process
    python -m examples.sglang_programs --url URL       # sgl_dsl on a server
    python -m examples.sglang_programs --url URL --sglang   # SGLang's own frontend on it
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

# SGLang's regexes for dtype gens (sglang.lang.ir), copied so that sgl_dsl runs need no sglang
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_STR = r"\"[\w\d\s]*\""
IP_REGEX = r"((25[0-5]|2[0-4]\d|[01]?\d\d?).){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"
META_KEYS = ("prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason")


def finished(state: Any, *names: str) -> bool:
    """Whether each named gen ended on its own (a stop, EOS or a complete constraint)."""
    return all(state.get_meta_info(n)["finish_reason"]["type"] != "length" for n in names)


def loads_json_ints(text: str) -> Any:
    """json.loads, allowing the `+` SGLang's REGEX_INT permits before a number ("+9")."""
    return json.loads(re.sub(r":(\s*)\+(?=\d)", r":\1", text))


def check_meta(state: Any, name: str) -> dict[str, Any]:
    meta = state.get_meta_info(name)
    assert all(k in meta for k in META_KEYS) and "type" in meta["finish_reason"], meta
    return meta


def run_few_shot_qa(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def few_shot_qa(s, question):
        s += "The following are questions with answers.\n\n"
        s += "Q: What is the capital of France?\nA: Paris\n"
        s += "Q: What is the capital of Germany?\nA: Berlin\n"
        s += "Q: What is the capital of Italy?\nA: Rome\n"
        s += "Q: " + question + "\n"
        s += "A:" + sgl.gen("answer", stop="\n", temperature=0)

    ret = few_shot_qa.run(
        question="What is the capital of the United States?", max_new_tokens=budget
    )
    assert isinstance(ret["answer"], str) and "\n" not in ret["answer"]
    check_meta(ret, "answer")
    questions = ["Japan", "the United Kingdom", "China"]
    rets = few_shot_qa.run_batch(
        [{"question": "What is the capital of " + q + "?"} for q in questions],
        temperature=0.1,
        max_new_tokens=budget,
    )
    answers = [r["answer"].strip() for r in rets]
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
    return {"answer": ret["answer"].strip(), "batch": answers}


def run_mt_bench(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def answer_mt_bench(s, question_1, question_2):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question_1)
        s += sgl.assistant(sgl.gen("answer_1"))
        with s.user():
            s += question_2
        with s.assistant():
            s += sgl.gen("answer_2")

    ret = answer_mt_bench.run(
        question_1="Compose an engaging travel blog post about a recent trip to Hawaii.",
        question_2="Rewrite your previous response. Start every sentence with the letter A.",
        temperature=0.7,
        max_new_tokens=budget,
    )
    messages = ret.messages()
    assert len(messages) in (4, 5), messages
    assert [m["role"] for m in messages[-4:]] == ["user", "assistant", "user", "assistant"]
    assert messages[-1]["content"].strip() == ret["answer_2"].strip()  # SGLang lstrips it
    return {"answer_1": ret["answer_1"], "answer_2": ret["answer_2"]}


def run_select(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def true_or_false(s, statement):
        s += "Determine whether the statement below is True, False, or Unknown.\n"
        s += "Statement: The capital of France is Pairs.\n"
        s += "Answer: True\n"
        s += "Statement: " + statement + "\n"
        s += "Answer:" + sgl.select("answer", ["True", "False", "Unknown"])

    answers = []
    berlin, tokyo = "The capital of Germany is Berlin.", "The capital of Canada is Tokyo."
    for statement in (berlin, tokyo, "Purple is a better color than green."):
        ret = true_or_false.run(statement=statement)
        assert ret["answer"] in ("True", "False", "Unknown")
        assert ret.text().endswith("Answer:" + ret["answer"])
        answers.append(ret["answer"])
    return {"answers": answers, "expected": ["True", "False", "Unknown"]}


def run_decode_int(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def decode_int(s):
        s += "The number of hours in a day is " + sgl.gen_int("hours") + "\n"
        s += "The number of days in a year is " + sgl.gen_int("days") + "\n"

    ret = decode_int.run(temperature=0.1, max_new_tokens=budget)
    for name in ("hours", "days"):
        pattern = r"[-+]?\d+\s*" if finished(ret, name) else r"[-+]?\d*\s*"
        assert re.fullmatch(pattern, ret[name]), (name, ret[name])
    return {"hours": ret["hours"].strip(), "days": ret["days"].strip()}


def run_decode_json_regex(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def decode_json(s):
        s += "Generate a JSON object to describe the basic city information of Paris.\n"
        s += "Here are the JSON object:\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": ' + sgl.gen("name", regex=REGEX_STR) + ",\n"
            s += '  "population": ' + sgl.gen("population", regex=REGEX_INT, stop=[" ", "\n"])
            s += ",\n"
            s += '  "area": ' + sgl.gen("area", regex=REGEX_INT, stop=[" ", "\n"]) + ",\n"
            s += '  "latitude": ' + sgl.gen("latitude", regex=REGEX_FLOAT, stop=[" ", "\n"])
            s += "\n}"

    ret = decode_json.run(temperature=0.0, max_new_tokens=budget)
    out = ret["json_output"]
    assert out.startswith("{\n") and out.endswith("\n}")
    if finished(ret, "name", "population", "area", "latitude"):
        obj = loads_json_ints(out)
        assert isinstance(obj["name"], str) and isinstance(obj["population"], int)
    return {"json_output": out}


def run_decode_json(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def decode_json(s):
        s += "Generate a JSON object to describe the basic city information of Paris.\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": ' + sgl.gen_string("name") + ",\n"
            s += '  "population": ' + sgl.gen_int("population") + ",\n"
            s += '  "area": ' + sgl.gen("area", dtype=int) + ",\n"
            s += '  "country": ' + sgl.gen_string("country") + ",\n"
            s += '  "timezone": ' + sgl.gen("timezone", dtype=str) + "\n"
            s += "}"

    ret = decode_json.run(max_new_tokens=budget)
    out = ret["json_output"]
    if finished(ret, "name", "population", "area", "country", "timezone"):
        obj = loads_json_ints(out)
        assert isinstance(obj["name"], str) and isinstance(obj["population"], int)
    return {"json_output": out}


def run_expert_answer(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def expert_answer(s, question):
        s += "Question: " + question + "\n"
        s += "A good person to answer this question is" + sgl.gen("expert", stop=[".", "\n"])
        s += ".\n"
        s += "For example," + s["expert"] + " would answer that " + sgl.gen("answer", stop=".")
        s += "."

    ret = expert_answer.run(
        question="What is the capital of France?", temperature=0.1, max_new_tokens=budget
    )
    assert "." not in ret["expert"] and "\n" not in ret["expert"]
    assert ("For example," + ret["expert"] + " would answer that ") in ret.text()
    return {"expert": ret["expert"], "answer": ret["answer"]}


def run_tool_use(sgl: Any, budget: int = 16) -> dict[str, Any]:
    def calculate(expression: str) -> str:
        # SGLang's test eval()s the model's text; here only plain arithmetic is evaluated
        if not re.fullmatch(r"[\d\s+\-*/().]+", expression):
            return "unknown"
        try:
            return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 (digits and ops)
        except (SyntaxError, ZeroDivisionError, TypeError):
            return "unknown"

    @sgl.function
    def tool_use(s, lhs, rhs):
        s += "Please perform computations using a calculator. "
        s += "You can use calculate(expression) to get the results.\n"
        s += "For example,\ncalculate(1+2)=3\ncalculate(3*4)=12\n"
        s += "Question: What is the product of " + str(lhs) + " and " + str(rhs) + "?\n"
        s += "Answer: The answer is calculate(" + sgl.gen("expression", stop=")") + ") = "
        with s.var_scope("answer"):
            s += calculate(s["expression"])

    ret = tool_use(lhs=257, rhs=983, temperature=0, max_new_tokens=budget)  # calling runs it
    ret.sync()
    assert ")" not in ret["expression"]
    assert ret["answer"] == calculate(ret["expression"])
    return {"expression": ret["expression"], "answer": ret["answer"], "expected": 257 * 983}


def run_react(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def react(s, question):
        s += (
            "Question: Which country does the founder of Microsoft live in?\n"
            "Thought 1: I need to search for the founder of Microsoft.\n"
            "Action 1: Search [Founder of Microsoft].\n"
            "Observation 1: The founder of Microsoft is Bill Gates.\n"
            "Thought 2: The answer is the United States.\n"
            "Action 2: Finish [United States].\n\n"
        )
        s += "Question: " + question + "\n"
        for i in range(1, 5):
            s += "Thought " + str(i) + ":" + sgl.gen(stop=[".", "\n"]) + ".\n"
            s += "Action " + str(i) + ": " + sgl.select("action_" + str(i), ["Search", "Finish"])
            if s["action_" + str(i)] == "Search":
                s += " [" + sgl.gen(stop="]") + "].\n"
                s += "Observation " + str(i) + ":" + sgl.gen(stop=[".", "\n"]) + ".\n"
            else:
                s += " [" + sgl.gen("answer", stop="]") + "].\n"
                break

    ret = react.run(
        question="What country does the creator of Linux live in?",
        temperature=0.1,
        max_new_tokens=budget,
    )
    ret.sync()  # SGLang's `in` does not wait for the program
    actions = []
    for i in range(1, 5):
        if "action_" + str(i) not in ret:
            break
        actions.append(ret["action_" + str(i)])
    assert actions and all(a in ("Search", "Finish") for a in actions)
    assert ("answer" in ret) == (actions[-1] == "Finish")
    return {"actions": actions, "answer": ret["answer"] if "answer" in ret else None}


def run_parallel_decoding(sgl: Any, budget: int = 16, fork_size: int = 3) -> dict[str, Any]:
    @sgl.function
    def parallel_decoding(s, topic):
        s += "Act as a helpful assistant.\n"
        s += "USER: Give some tips for " + topic + ".\n"
        s += "ASSISTANT: Okay. Here are " + str(fork_size) + " concise tips:\n"
        for i in range(1, 1 + fork_size):
            s += str(i) + "." + sgl.gen(max_tokens=budget, stop=[".", "\n"]) + ".\n"
        forks = s.fork(fork_size)
        for i in range(fork_size):
            forks[i] += "Now, I expand tip " + str(i + 1) + " into a paragraph:\n"
            forks[i] += "Tip " + str(i + 1) + ":"
            forks[i] += sgl.gen("detailed_tip", budget, stop=["\n\n"])
        forks.join()
        s += "Here are these tips with detailed explanation:\n"
        for i in range(fork_size):
            s += "Tip " + str(i + 1) + ":" + forks[i]["detailed_tip"] + "\n"
        s += "\nIn summary," + sgl.gen("summary", max_tokens=budget)

    ret = parallel_decoding.run(topic="writing a good blog post", temperature=0.3)
    assert isinstance(ret["summary"], str)
    tips = ret["detailed_tip"]
    assert isinstance(tips, list) and len(tips) == fork_size
    assert all(("Tip " + str(i + 1) + ":" + t) in ret.text() for i, t in enumerate(tips))
    return {"summary": ret["summary"]}


def run_parallel_encoding(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def parallel_encoding(s, question, context_0, context_1, context_2):
        s += "USER: I will ask a question based on some statements.\n"
        s += "ASSISTANT: Sure. I will give the answer.\n"
        s += "USER: Please memorize these statements.\n"
        contexts = [context_0, context_1, context_2]
        forks = s.fork(len(contexts))
        forks += lambda i: "Statement " + str(i) + ": " + contexts[i] + "\n"
        forks.join(mode="concate_and_append")
        s += "Now, please answer the following question. Do not list options."
        s += "\nQuestion: " + question + "\n"
        s += "ASSISTANT:" + sgl.gen("answer", max_tokens=budget)

    ret = parallel_encoding.run(
        question="Who is the father of Julian?",
        context_0="Ethan is the father of Liam.",
        context_1="Noah is the father of Julian.",
        context_2="Oliver is the father of Carlos.",
        temperature=0,
    )
    statements = (
        "Statement 0: Ethan is the father of Liam.\n"
        "Statement 1: Noah is the father of Julian.\n"
        "Statement 2: Oliver is the father of Carlos.\n"
    )
    assert "Please memorize these statements.\n" + statements + "Now, please" in ret.text()
    return {"answer": ret["answer"], "expected": "Noah"}


def run_stream(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def qa(s, question):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer"))

    question = "Compose an engaging travel blog post about a recent trip to Hawaii."
    ret = qa(question=question, stream=True, max_new_tokens=budget)
    assert "".join(ret.text_iter()) == ret.text() and ret["answer"] in ret.text()
    ret = qa(question=question, stream=True, max_new_tokens=budget)
    pieces = list(ret.text_iter("answer"))
    assert "".join(pieces) == ret["answer"]
    return {"answer": ret["answer"], "pieces": len(pieces)}


def run_regex(sgl: Any, budget: int = 24) -> dict[str, Any]:
    @sgl.function
    def regex_gen(s):
        s += "Q: What is the IP address of the Google DNS servers?\n"
        s += "A: " + sgl.gen("answer", temperature=0, regex=IP_REGEX)

    ret = regex_gen.run(max_new_tokens=budget)
    if finished(ret, "answer"):
        assert re.fullmatch(IP_REGEX, ret["answer"]), ret["answer"]
    return {"answer": ret["answer"], "expected": "8.8.8.8"}


def run_dtype_gen(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def dtype_gen(s):
        s += "Q: What is the full name of DNS?\n"
        s += "A: The full names is " + sgl.gen("str_res", dtype=str, stop="\n") + "\n"
        s += "Q: Which year was DNS invented?\n"
        s += "A: " + sgl.gen("int_res", dtype=int) + "\n"
        s += "Q: What is the value of pi?\n"
        s += "A: " + sgl.gen("float_res", dtype=float) + "\n"
        s += "Q: Is the sky blue?\n"
        s += "A: " + sgl.gen("bool_res", dtype=bool) + "\n"

    state = dtype_gen.run(max_new_tokens=budget)
    if finished(state, "int_res"):
        state["int_res"] = int(state["int_res"])
    if finished(state, "float_res"):
        state["float_res"] = float(state["float_res"])
    if finished(state, "bool_res"):
        assert state["bool_res"] in ("True", "False", "true", "false"), state["bool_res"]
    return {k: state[k] for k in ("str_res", "int_res", "float_res", "bool_res")}


def run_completion_speculative(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function(num_api_spec_tokens=64)
    def gen_character_spec(s):
        s += "Construct a character within the following format:\n"
        s += "Name: Steve Jobs.\nBirthday: February 24, 1955.\nJob: Apple CEO.\n"
        s += "\nPlease generate new Name, Birthday and Job.\n"
        s += "Name:" + sgl.gen("name", stop="\n") + "\nBirthday:" + sgl.gen("birthday", stop="\n")
        s += "\nJob:" + sgl.gen("job", stop="\n") + "\n"

    state = gen_character_spec(max_new_tokens=budget)
    state.sync()
    assert all("\n" not in state[k] for k in ("name", "birthday", "job"))
    return {k: state[k] for k in ("name", "birthday", "job")}


def run_min_tokens(sgl: Any, budget: int = 16) -> dict[str, Any]:
    min_tokens, max_tokens = budget // 2, budget

    @sgl.function
    def convo_1(s):
        s += sgl.user("What is the capital of the United States?")
        s += sgl.assistant(sgl.gen("answer", min_tokens=min_tokens, max_tokens=max_tokens))

    state = convo_1.run()
    meta = check_meta(state, "answer")
    assert min_tokens <= meta["completion_tokens"] <= max_tokens, meta
    return {"answer": state["answer"]}


HELLASWAG_SHOTS = (
    "A man is sitting on a roof. He starts pulling up roofing on a roof.\n\n"
    "A woman is outside with a bucket and a dog. The dog is running around trying to avoid "
    "a bath. She gets the dog wet, then it runs away again.\n\n"
)


def run_hellaswag_select(sgl: Any, budget: int = 16) -> dict[str, Any]:
    @sgl.function
    def few_shot_hellaswag(s, question, choices):
        s += HELLASWAG_SHOTS + question
        s += sgl.select("answer", choices=choices)

    boy = [" runs into a car.", " gets a medal.", " stops and stretches."]
    chef = [" cries a little.", " flies away.", " sings to the moon."]
    items = [
        {"question": "A boy is running down a track. The boy", "choices": boy},
        {"question": "A chef is chopping onions. The chef", "choices": chef},
    ]
    states = few_shot_hellaswag.run_batch(items, temperature=0, num_threads=2)
    picks = [st["answer"] for st in states]
    assert all(p in item["choices"] for p, item in zip(picks, items, strict=True))
    return {"answers": picks}


# name -> run_<name>, in the order of SGLang's test file
PROGRAMS: dict[str, Callable[..., dict[str, Any]]] = {
    name[len("run_") :]: fn for name, fn in list(globals().items()) if name.startswith("run_")
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a `python -m runtime.server` (default: in-process)")
    parser.add_argument("--sglang", action="store_true", help="SGLang's frontend (needs --url)")
    parser.add_argument("--budget", type=int, default=48, help="max new tokens per gen")
    parser.add_argument("programs", nargs="*", default=list(PROGRAMS))
    args = parser.parse_args()
    if args.sglang:
        import sglang as sgl

        if not args.url:
            parser.error("--sglang runs SGLang's frontend against a server: give --url")
    else:
        import sgl_dsl as sgl  # type: ignore[no-redef]
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    sgl.set_default_backend(backend)
    for name in args.programs:
        try:
            print(f"{name}: ok {PROGRAMS[name](sgl, budget=args.budget)}")
        except Exception as exc:  # report every program, as a user trying them would
            print(f"{name}: FAILED {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
