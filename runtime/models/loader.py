"""Read a model's config, weights and tokenizer from a local folder or a GGUF file.

A folder is what `save_pretrained` writes: `config.json` plus `*.safetensors` (sharded or not).
A `.gguf` file is read as it is (`gguf.py`): its weights stay in their block formats.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.config import ModelConfig, load_config
from runtime.errors import ModelNotFoundError
from runtime.models.gguf import load_gguf, load_tokenizer

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    config: ModelConfig
    state_dict: dict[str, torch.Tensor]  # GGUF: quantized weights as cpu_quant.QuantTensor
    tokenizer: object  # a transformers tokenizer
    source: Path


def _load_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"no *.safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def load_model_files(model: str | Path) -> LoadedModel:
    """Config, fp32-or-native state dict and tokenizer of a folder or `.gguf` file."""
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFoundError(
            f"model path {str(path)!r} does not exist (expected a folder with config.json and "
            f"*.safetensors, or a .gguf file)"
        )
    if path.is_file() and path.suffix == ".gguf":
        config, state = load_gguf(path)
        return LoadedModel(config, state, load_tokenizer(path), path)
    if not path.is_dir():
        raise ModelNotFoundError(f"{path} is neither a model folder nor a .gguf file")
    config = load_config(path)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"no usable tokenizer in {path}: {exc}") from exc
    return LoadedModel(config, _load_safetensors(path), tokenizer, path)
