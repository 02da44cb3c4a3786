"""`python -m runtime.kv_size MODEL_DIR_OR_CONFIG`: the KV-size tool (runtime/memory/kv_size.py)."""

from runtime.memory.kv_size import main

if __name__ == "__main__":
    raise SystemExit(main())
