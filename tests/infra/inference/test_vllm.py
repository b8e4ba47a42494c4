"""vLLM backend: request/response mapping against a real HTTP server on 127.0.0.1 that answers
like vLLM's OpenAI-compatible `/v1/completions`; error mapping; and (GPU only) a real vLLM.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from contracts.task import SamplingParams
from infra.inference import InferenceError, PolicyHandle, get_backend
from infra.inference.vllm import VLLMBackend
from infra.settings import Settings

SERVED = PolicyHandle("run-v", 3, Path("/unused"))


class FakeVLLM:
    """Serves `SERVED.name`; answers each prompt with ids derived from the request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.legacy = False  # True: answer like vLLM < 0.10.2 (no `token_ids`)
        self.fail_with: int | None = None

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if self.fail_with is not None:
            return web.json_response({"object": "error", "message": "boom"}, status=self.fail_with)
        if body["model"] != SERVED.name:
            error = {
                "object": "error",
                "message": f"The model `{body['model']}` does not exist.",
                "type": "NotFoundError",
                "code": 404,
            }
            return web.json_response(error, status=404)
        prompt: list[int] = body["prompt"]
        ids = [len(prompt), body["max_tokens"], body.get("seed", 0)][: body["max_tokens"]]
        choice: dict[str, Any] = {
            "index": 0,
            "text": "ignored",
            "finish_reason": "length" if len(ids) == body["max_tokens"] else "stop",
            "logprobs": {
                "tokens": [f"token_id:{t}" for t in ids],
                "token_logprobs": [-0.5 * (k + 1) for k in range(len(ids))],
                "top_logprobs": [None] * len(ids),
                "text_offset": [0] * len(ids),
            },
        }
        if not self.legacy and body.get("return_token_ids"):
            choice["token_ids"] = ids
            choice["prompt_token_ids"] = prompt
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})


@pytest_asyncio.fixture
async def fake_vllm() -> AsyncIterator[tuple[FakeVLLM, str]]:
    fake = FakeVLLM()
    app = web.Application()
    app.router.add_post("/v1/completions", fake.completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield fake, f"http://127.0.0.1:{port}/v1"
    await runner.cleanup()


def backend_for(url: str) -> VLLMBackend:
    backend = get_backend(Settings(inference={"backend": "vllm", "vllm": {"url": url}}))
    assert isinstance(backend, VLLMBackend)
    return backend


@pytest.mark.asyncio
async def test_each_prompt_is_sent_with_its_own_params_and_mapped_back(
    fake_vllm: tuple[FakeVLLM, str],
) -> None:
    fake, url = fake_vllm
    backend = backend_for(url)
    prompts = [[1, 2, 3], [4, 5], [6]]
    params = [
        SamplingParams(temperature=0.0, top_p=0.5, max_new_tokens=8),
        SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=2, seed=17),
        SamplingParams(temperature=1.2, max_new_tokens=5, seed=4),
    ]
    outputs = await backend.generate(prompts, params, SERVED)
    await backend.close()
    assert [o.token_ids for o in outputs] == [[3, 8, 0], [2, 2], [1, 5, 4]]
    assert [o.finish_reason for o in outputs] == ["stop", "length", "stop"]
    assert outputs[0].logprobs == [-0.5, -1.0, -1.5]
    sent = sorted(fake.requests, key=lambda r: len(r["prompt"]), reverse=True)
    assert [r["prompt"] for r in sent] == prompts
    assert all(r["model"] == "run-v/v3" and r["logprobs"] == 0 for r in sent)
    assert all(r["return_token_ids"] and r["return_tokens_as_token_ids"] for r in sent)
    assert [r["max_tokens"] for r in sent] == [8, 2, 5]
    assert [r["temperature"] for r in sent] == [0.0, 0.8, 1.2]
    assert [r["top_p"] for r in sent] == [1.0, 0.9, 0.95]  # top_p is moot when greedy
    assert [r.get("seed") for r in sent] == [None, 17, 4]


@pytest.mark.asyncio
async def test_old_servers_token_ids_come_from_the_logprob_tokens(
    fake_vllm: tuple[FakeVLLM, str],
) -> None:
    fake, url = fake_vllm
    fake.legacy = True
    backend = backend_for(url)
    (output,) = await backend.generate([[9, 9]], [SamplingParams(max_new_tokens=3)], SERVED)
    await backend.close()
    assert output.token_ids == [2, 3, 0] and output.logprobs == [-0.5, -1.0, -1.5]


@pytest.mark.asyncio
async def test_unserved_version_and_server_errors_are_retryable(
    fake_vllm: tuple[FakeVLLM, str],
) -> None:
    fake, url = fake_vllm
    backend = backend_for(url)
    other = PolicyHandle("run-v", 4, Path("/unused"))
    with pytest.raises(InferenceError, match="does not serve 'run-v/v4'") as unserved:
        await backend.generate([[1]], [SamplingParams()], other)
    assert unserved.value.retryable
    fake.fail_with = 503
    with pytest.raises(InferenceError, match="HTTP 503") as unavailable:
        await backend.generate([[1]], [SamplingParams()], SERVED)
    assert unavailable.value.retryable
    fake.fail_with = 400
    with pytest.raises(InferenceError, match="rejected") as rejected:
        await backend.generate([[1]], [SamplingParams()], SERVED)
    assert not rejected.value.retryable
    await backend.close()


@pytest.mark.asyncio
async def test_an_unreachable_server_is_retryable() -> None:
    backend = backend_for("http://127.0.0.1:9/v1")  # discard port: nothing listens
    with pytest.raises(InferenceError, match="unreachable") as unreachable:
        await backend.generate([[1]], [SamplingParams()], SERVED)
    assert unreachable.value.retryable
    await backend.close()


@pytest.mark.gpu
@pytest.mark.asyncio
async def test_real_vllm_server_matches_the_mapping() -> None:
    """Against a vLLM that serves a policy as `<run>/v<version>` (TEMPERED_TEST_VLLM_URL)."""
    url = os.environ.get("TEMPERED_TEST_VLLM_URL")
    if importlib.util.find_spec("vllm") is None or not url:
        pytest.skip(
            "needs vllm and TEMPERED_TEST_VLLM_URL (a server started with --served-model-name)"
        )
    name = os.environ.get("TEMPERED_TEST_VLLM_MODEL", "tiny/v0")
    run, _, version = name.rpartition("/v")
    backend = backend_for(url)
    params = [
        SamplingParams(temperature=0.0, max_new_tokens=8),
        SamplingParams(seed=1, max_new_tokens=8),
    ]
    outputs = await backend.generate(
        [[1, 2, 3], [4, 5, 6]], params, PolicyHandle(run, int(version), Path("/unused"))
    )
    await backend.close()
    for output in outputs:
        assert 0 < len(output.token_ids) <= 8 and len(output.logprobs) == len(output.token_ids)
        assert all(lp <= 0.0 for lp in output.logprobs)
