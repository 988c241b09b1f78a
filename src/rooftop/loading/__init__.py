"""Loading models: GGUF files, Hugging Face directories, the bundled default, and their tokenizers."""
