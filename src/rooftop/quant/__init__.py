"""Weight formats: GGUF block decoding (and, later, quantized linears)."""
