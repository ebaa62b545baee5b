"""The in-process mode's request mapping and settings, without vLLM (pure)."""

from __future__ import annotations

import time

import pytest
from llmlab_common.messages import InferenceRequest, SamplingParams
from llmlab_worker.engine import EngineRequestError
from llmlab_worker_vllm.inproc import sampling_fields, unsupported
from llmlab_worker_vllm.settings import VllmWorkerSettings
from pydantic import ValidationError

pytestmark = pytest.mark.unit


def _req(**params: object) -> InferenceRequest:
    now = time.time()
    return InferenceRequest(
        request_id="r",
        attempt=1,
        gateway_id="g",
        reply_subject="s",
        endpoint="chat",
        model="m",
        deployment="d",
        pool="p",
        messages=[{"role": "user", "content": "hi"}],
        params=SamplingParams(**{"max_tokens": 100, **params}),  # type: ignore[arg-type]
        created_at=now,
        dispatched_at=now,
        start_deadline=now + 10,
        deadline=now + 60,
    )


def test_request_fields_override_the_models_defaults_and_unset_ones_keep_them() -> None:
    defaults = {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1}
    out = sampling_fields(_req(temperature=0.0, seed=7, stop=["\n"]), defaults, prompt_len=10, max_model_len=2048)
    assert out == {
        "temperature": 0.0,
        "top_p": 0.9,
        "repetition_penalty": 1.1,
        "seed": 7,
        "stop": ["\n"],
        "max_tokens": 100,
    }
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1}  # not mutated


def test_max_tokens_is_clamped_to_what_the_context_leaves_and_a_full_prompt_is_refused() -> None:
    assert sampling_fields(_req(), {}, prompt_len=2000, max_model_len=2048)["max_tokens"] == 48
    with pytest.raises(EngineRequestError) as exc:
        sampling_fields(_req(), {}, prompt_len=2048, max_model_len=2048)
    assert exc.value.status == 400 and "2048" in exc.value.message


def test_logit_bias_keys_become_token_ids() -> None:
    assert sampling_fields(_req(logit_bias={"2": -100}), {}, 1, 10)["logit_bias"] == {2: -100.0}
    with pytest.raises(EngineRequestError) as exc:
        sampling_fields(_req(logit_bias={"the": 5}), {}, 1, 10)
    assert exc.value.status == 400


def test_what_needs_the_servers_parsers_is_named() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    assert unsupported(_req()) is None
    assert unsupported(_req(tool_choice="none")) is None
    assert unsupported(_req(response_format={"type": "text"})) is None
    assert "tool" in (unsupported(_req(tools=[tool])) or "")
    assert "tool" in (unsupported(_req(tool_choice="required")) or "")
    assert "response_format" in (unsupported(_req(response_format={"type": "json_object"})) or "")


def test_inproc_settings_need_a_model_and_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMLAB_WORKER_ENGINE_MODE", "inproc")
    with pytest.raises(ValidationError, match="ENGINE_MODEL"):
        VllmWorkerSettings()
    monkeypatch.setenv("LLMLAB_WORKER_ENGINE_MODEL", "/models/x")
    monkeypatch.setenv("LLMLAB_WORKER_ENGINE_ARGS", '{"dtype": "bfloat16", "max_model_len": 2048}')
    s = VllmWorkerSettings()
    assert s.served_name == "/models/x" and s.engine_args == {"dtype": "bfloat16", "max_model_len": 2048}
    monkeypatch.setenv("LLMLAB_WORKER_ENGINE_SERVED_NAME", "small")
    assert VllmWorkerSettings().served_name == "small"
    monkeypatch.setenv("LLMLAB_WORKER_PROCESSES", "2")
    with pytest.raises(ValidationError, match="PROCESSES must be 1"):
        VllmWorkerSettings()
