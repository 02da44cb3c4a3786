"""Model families, one file per architecture (`llama.py`: Llama, Mistral, Qwen2), their shared
pieces (RoPE, the batch a forward reads, weight loading), and the registry that picks a model
class from the config's `architectures` (`registry.py`)."""
