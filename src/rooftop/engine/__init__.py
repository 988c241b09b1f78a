"""The engine: sequences, KV cache, prefill and decode, sampling, and the LLM front door."""
