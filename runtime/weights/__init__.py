"""Loading model weights and tokenizers from local folders or GGUF files."""
