"""rooftop serve on the bundled SmolLM2 (slow): real text through the openai client, streamed equal to not streamed."""

from __future__ import annotations

import openai
import pytest
from serve_support import running_server

pytestmark = pytest.mark.slow


def test_the_bundled_model_answers_through_the_openai_client(bundled_llm):
    question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    with running_server(None, llm=bundled_llm) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        name = c.models.list().data[0].id
        assert name == "SmolLM2-135M-Instruct.Q4_1"
        full = c.chat.completions.create(model=name, messages=question, max_tokens=16, temperature=0)
        assert "Paris" in full.choices[0].message.content and full.choices[0].finish_reason == "stop"
        stream = c.chat.completions.create(model=name, messages=question, max_tokens=16, temperature=0, stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream) == full.choices[0].message.content
        text = c.completions.create(model=name, prompt="The capital of France is", max_tokens=4, temperature=0)
        assert "Paris" in text.choices[0].text
