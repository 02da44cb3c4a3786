"""Which model class runs a checkpoint: chosen by the config's `architectures` (the names
`transformers` writes into config.json), one entry per architecture.

A new family adds its file beside `llama.py` and its architectures here; the engine, the
scheduler and the memory code need no change (a model brings its own KV layout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.errors import UnsupportedModelError
from runtime.models.deepseek import DeepseekModel
from runtime.models.gemma3 import Gemma3Model
from runtime.models.llama import LlamaModel
from runtime.models.mixtral import MixtralModel
from runtime.models.phi3 import Phi3Model
from runtime.models.qwen3 import Qwen3Model

if TYPE_CHECKING:
    from runtime.config import ModelConfig

MODELS: dict[str, type] = {
    "LlamaForCausalLM": LlamaModel,
    "MistralForCausalLM": LlamaModel,
    "Qwen2ForCausalLM": LlamaModel,
    "DeepseekV2ForCausalLM": DeepseekModel,
    "DeepseekV3ForCausalLM": DeepseekModel,
    "Qwen3ForCausalLM": Qwen3Model,
    "Qwen3MoeForCausalLM": Qwen3Model,
    "Gemma3ForCausalLM": Gemma3Model,
    "MixtralForCausalLM": MixtralModel,
    "Phi3ForCausalLM": Phi3Model,
}


def model_class(config: ModelConfig) -> type:
    """The class for `config.architecture`; UnsupportedModelError naming it and the supported
    architectures otherwise."""
    cls = MODELS.get(config.architecture)
    if cls is None:
        raise UnsupportedModelError(
            f"architecture {config.architecture!r} is not supported; "
            f"supported architectures: {sorted(MODELS)}"
        )
    return cls
