"""Ours against other engines on the same model and prompts: vLLM's CPU build and llama.cpp's
`llama-server` (GGUF files)."""
