"""`rooftop serve`: an OpenAI-compatible HTTP server over the engine, with Prometheus metrics and a live dashboard."""
