"""GET /v1/models/{id}: OpenAI's retrieve (`client.models.retrieve(name)`), the served model's object or a 404."""

from __future__ import annotations

import httpx
import openai
import pytest
from serve_support import api_error, running_server


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_retrieve_gives_the_served_models_object(server):
    listed = client(server).models.list().data[0]
    got = client(server).models.retrieve("tiny-long")
    assert (got.id, got.object, got.owned_by) == ("tiny-long", "model", "rooftop")
    assert got.model_extra["max_model_len"] == 256 and got.model_extra["root"] == listed.model_extra["root"]
    head = httpx.head(f"{server}/v1/models/tiny-long")
    assert head.status_code == 200 and head.content == b""


@pytest.mark.parametrize("name", ["other", "Qwen/Qwen3-0.6B", "tiny-long/extra"])
def test_any_other_id_is_a_404_with_openais_error_body(server, name):
    error = api_error(httpx.get(f"{server}/v1/models/{name}"), 404)
    assert error["type"] == "not_found_error" and error["param"] == "model"
    assert repr(name) in error["message"] and "'tiny-long'" in error["message"]
    with pytest.raises(openai.NotFoundError):
        client(server).models.retrieve(name)


def test_retrieve_needs_the_api_key_as_the_list_does(long_gguf):
    with running_server(long_gguf, api_key="secret") as url:
        api_error(httpx.get(f"{url}/v1/models/tiny-long"), 401)
        keyed = httpx.get(f"{url}/v1/models/tiny-long", headers={"Authorization": "Bearer secret"})
        assert keyed.status_code == 200 and keyed.json()["id"] == "tiny-long"
