"""`rooftop bench serve`: a load generator for any OpenAI-compatible endpoint, with vLLM's metric definitions."""
