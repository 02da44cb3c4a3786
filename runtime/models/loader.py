"""Read a model's config, weights and tokenizer from a local folder or a GGUF file.

A folder is what `save_pretrained` writes: `config.json` plus `*.safetensors` (sharded or not).
A `.gguf` file is read as it is (`gguf.py`): its weights stay in their block formats.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.config import ModelConfig, load_config
from runtime.errors import ModelNotFoundError
from runtime.kernels.cpu.quant import QUANTIZATIONS, quantize
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


def _model_type_only(path: Path) -> object | None:
    """A config that tells `AutoTokenizer` only the folder's model type, when that is all it
    needs: `tokenizer_config.json` names the tokenizer class and nothing is remote code. Its
    own `AutoConfig` imports the model family's config module, which pulls in much of
    transformers' modelling and `torch.distributed.tensor`: about 3 s of CPU at every start
    (the class chosen is the same; None: let it read the config itself)."""
    try:
        model = json.loads((path / "config.json").read_text())
        tokenizer = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    model_type = model.get("model_type")
    if not (isinstance(model_type, str) and model_type and tokenizer.get("tokenizer_class")):
        return None
    if "auto_map" in model or "auto_map" in tokenizer:
        return None
    from transformers import PreTrainedConfig

    stub = type("ModelTypeOnly", (PreTrainedConfig,), {"model_type": model_type})()
    stub._name_or_path = str(path)
    return stub


def load_folder_tokenizer(path: Path) -> object:
    """`AutoTokenizer.from_pretrained(path)`, without importing the model family's config
    where the folder says which tokenizer class it has (`_model_type_only`)."""
    from transformers import AutoTokenizer

    config = _model_type_only(path)
    if config is None:
        return AutoTokenizer.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path), config=config)


def quantize_state(state: dict[str, torch.Tensor], quantization: str) -> dict[str, object]:
    """The projection, embedding and LM-head matrices of a float checkpoint quantized into a
    GGUF block format (`quantization`: a key of cpu_quant.QUANTIZATIONS); norms, biases and
    matrices whose rows are not whole blocks stay as they are."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization {quantization!r} is not supported; choose one of {sorted(QUANTIZATIONS)}"
        )
    fmt = QUANTIZATIONS[quantization]
    out: dict[str, object] = {}
    for name, t in state.items():
        wanted = name.endswith(("_proj.weight", "embed_tokens.weight", "lm_head.weight"))
        if wanted and t.dim() == 2 and t.shape[1] % 32 == 0 and t.is_floating_point():
            out[name] = quantize(t, fmt)
        else:
            out[name] = t
    return out


def load_model_files(model: str | Path, quantization: str | None = None) -> LoadedModel:
    """Config, fp32-or-native state dict and tokenizer of a folder or `.gguf` file; with
    `quantization` ("q8_0", "q4_0"), a folder's matrices quantized at load (a GGUF keeps the
    formats it has: asking to quantize one is a ValueError)."""
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFoundError(
            f"model path {str(path)!r} does not exist (expected a folder with config.json and "
            f"*.safetensors, or a .gguf file)"
        )
    if path.is_file() and path.suffix == ".gguf":
        if quantization:
            raise ValueError(
                f"quantization {quantization!r} applies to safetensors folders; {path.name} is "
                f"a GGUF file and runs in the formats it stores"
            )
        tokenizer = load_tokenizer(path)  # first: its reading's peak without the weights
        config, state = load_gguf(path)
        return LoadedModel(config, state, tokenizer, path)
    if not path.is_dir():
        raise ModelNotFoundError(f"{path} is neither a model folder nor a .gguf file")
    config = load_config(path)
    try:
        tokenizer = load_folder_tokenizer(path)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"no usable tokenizer in {path}: {exc}") from exc
    state = _load_safetensors(path)
    if quantization:
        state = quantize_state(state, quantization)
    return LoadedModel(config, state, tokenizer, path)
