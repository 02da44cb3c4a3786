"""A fixed slice of the JSONSchemaBench sample, walked token by token with the deepseek
tokenizer: no invalid instance accepted among compiled schemas, most schemas fully correct.
(The whole suite runs in `python -m benchmarks.grammar.compare`.)"""

from __future__ import annotations

import time

import pytest

from grammar import GrammarError, UnsupportedSchemaError, compile_json_schema
from tests.support.json_text import serialise
from tests.support.schema_bench import NO_BENCH, bench_files, fixed_slice, load_case
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import walk

SLICE = 30
MIN_FULLY_CORRECT = 0.85  # of the compiled schemas in the slice

pytestmark = pytest.mark.skipif(not bench_files(), reason=NO_BENCH)


def test_fixed_slice_of_the_real_world_suite() -> None:
    vocab, tok = deepseek_vocab(), deepseek_tokenizer()
    compiled = correct = unsupported = failed = 0
    invalid_accepted: list[str] = []
    for path in fixed_slice(SLICE):
        case = load_case(path)
        t0 = time.perf_counter()
        try:
            g = compile_json_schema(case.schema, vocab)
        except UnsupportedSchemaError:
            unsupported += 1
            continue
        except GrammarError:
            failed += 1  # e.g. over the state budget: counts as not compiled
            continue
        compiled += 1
        ok = True
        for instance, valid in case.tests:
            ids = tok.encode(serialise(case.schema, instance), add_special_tokens=False)
            accepted = walk(g, ids)
            if accepted and not valid:
                invalid_accepted.append(case.name)
            ok &= accepted == valid
        correct += ok and time.perf_counter() - t0 < 60
    assert not invalid_accepted, invalid_accepted
    assert compiled + unsupported + failed == SLICE
    assert compiled >= SLICE * 0.6
    assert correct >= MIN_FULLY_CORRECT * compiled, (correct, compiled)
