"""vLLM backend: the same `InferenceBackend` over a vLLM OpenAI-compatible server.

    TEMPERED_INFERENCE__BACKEND=vllm TEMPERED_INFERENCE__VLLM__URL=http://gpu-0:8000/v1 \\
        tempered worker inference

Each prompt is one `POST {url}/completions` with the prompt as token ids and its own
sampling params (temperature, top_p, max_tokens, seed); the calls of a batch go out together
and vLLM's continuous batching schedules them. The request asks for `logprobs: 0` (the sampled
token's log-prob only), `return_token_ids` (vLLM >= 0.10.2: `choices[0].token_ids`) and, for
older servers, `return_tokens_as_token_ids` (tokens come back as "token_id:<id>"). vLLM's default
`logprobs_mode` is `raw_logprobs`: log-softmax of the raw logits, before temperature and top-p,
the same quantity the local backend records.

Policy versions: `model` is `PolicyHandle.name` (`<run>/v<version>`). The GPU deployment
serves each version under that name: on a new `latest.json` it restarts (or starts a second)
vLLM on the fetched version directory with `--served-model-name <run>/v<version>`, and only
then retires the old one, so in-flight requests finish on the version they asked for. A
request for a version the server does not serve gets a 404, surfaced as a retryable
`InferenceError` (the activity retries until the deployment catches up). No LoRA adapters.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from contracts.task import SamplingParams
from infra.inference.base import FinishReason, GenerationOutput, InferenceError, PolicyHandle
from infra.settings import VLLMSettings


def completion_request(prompt: list[int], params: SamplingParams, model: str) -> dict[str, Any]:
    """The JSON body of one `/completions` call."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p if params.temperature > 0 else 1.0,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "stream": False,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def parse_completion(payload: dict[str, Any]) -> GenerationOutput:
    """A `GenerationOutput` from a `/completions` response with exactly one choice."""
    try:
        (choice,) = payload["choices"]
        logprobs = choice.get("logprobs") or {}
        token_logprobs = logprobs.get("token_logprobs")
        token_ids = choice.get("token_ids")
        if token_ids is None:
            token_ids = [int(str(t).removeprefix("token_id:")) for t in logprobs["tokens"]]
        if token_logprobs is None or len(token_logprobs) != len(token_ids):
            raise ValueError("token_logprobs missing or not one per token")
        finish = choice.get("finish_reason")
        reason: FinishReason = "length" if finish == "length" else "stop"
        return GenerationOutput(
            [int(t) for t in token_ids], [float(x) for x in token_logprobs], reason
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InferenceError(f"malformed vLLM completion response: {exc!r}") from exc


class VLLMBackend:
    """`InferenceBackend` that sends each prompt to a vLLM server's `/completions`."""

    name = "vllm"

    def __init__(self, config: VLLMSettings | None = None):
        config = config or VLLMSettings()
        self.url = config.url.rstrip("/") + "/completions"
        self.timeout = aiohttp.ClientTimeout(
            total=config.timeout_s, connect=config.connect_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def _complete(
        self, prompt: list[int], params: SamplingParams, model: str
    ) -> GenerationOutput:
        body = completion_request(prompt, params, model)
        try:
            async with self._client().post(self.url, json=body) as response:
                text = await response.text()
                if response.status == 404:
                    raise InferenceError(
                        f"vLLM at {self.url} does not serve {model!r}: {text[:300]}"
                    )
                if response.status == 400:
                    raise InferenceError(
                        f"vLLM rejected the request: {text[:300]}", retryable=False
                    )
                if response.status != 200:
                    raise InferenceError(f"vLLM answered HTTP {response.status}: {text[:300]}")
                payload = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise InferenceError(f"vLLM at {self.url} unreachable: {exc!r}") from exc
        return parse_completion(payload)

    async def generate(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        calls = [self._complete(p, q, policy.name) for p, q in zip(prompts, params, strict=True)]
        return list(await asyncio.gather(*calls))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
