"""The decoder-only transformer; Llama, Qwen2 and Qwen3 differ only by ModelConfig flags."""
