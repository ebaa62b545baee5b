"""worker-openai's pure parts: the model state each backend reports (recorded and documented shapes), why an
engine gave no answer, and the model load timed from the health answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmlab_worker.engine import EngineRequestError
from llmlab_worker.http1 import EngineStreamBroken, EngineUnreachable
from llmlab_worker_openai import adapter as a

DATA = Path(__file__).parent / "data"


def _doc(name: str) -> object:
    return json.loads((DATA / name).read_text())


def test_ollama_ps_names_the_models_in_memory_with_their_default_tag() -> None:
    assert a.ollama_loaded(_doc("ollama_ps.json")) == {"gemma3:latest"}
    assert a.ollama_loaded({"models": []}) == set()  # nothing loaded: every request is cold
    assert a.ollama_loaded({"error": "x"}) is None  # not the shape: unknown, never "nothing loaded"
    adapter = a.OllamaAdapter("http://127.0.0.1:1", 4)
    adapter.loaded = a.ollama_loaded(_doc("ollama_ps.json"))
    assert not adapter.is_cold("gemma3") and not adapter.is_cold("gemma3:latest") and adapter.is_cold("llama3")


@pytest.mark.parametrize("doc", ["lmstudio_v0_models.json", "lmstudio_v1_models.json"])
def test_lmstudio_lists_the_loaded_model_in_both_api_versions(doc: str) -> None:
    assert a.lmstudio_loaded(_doc(doc)) == {"meta-llama-3.1-8b-instruct:latest"}
    adapter = a.LMStudioAdapter("http://127.0.0.1:1", 4)
    adapter.loaded = a.lmstudio_loaded(_doc(doc))
    assert adapter.is_cold("qwen2-vl-7b-instruct") and not adapter.is_cold("meta-llama-3.1-8b-instruct")


def test_a_server_that_does_not_say_never_makes_a_request_cold() -> None:
    adapter = a.LocalServerAdapter("http://127.0.0.1:1", 4)
    assert adapter.loaded is None and not adapter.is_cold("anything")


def test_llamacpp_slots_count_the_busy_ones() -> None:
    assert a.slots_load(_doc("llamacpp_slots.json")).running == 1.0
    assert a.slots_load({"error": "slots disabled"}).running is None


def test_llamacpp_metrics_read_as_load_and_absent_figures_stay_none() -> None:
    text = (DATA.parent / "data" / "llamacpp_metrics.txt").read_text()
    from llmlab_common.metrics import parse_prometheus_text

    load = a.LlamaCppAdapter("http://127.0.0.1:1", 4).load_from_metrics(parse_prometheus_text(text))
    assert (load.running, load.waiting) == (2.0, 1.0)
    assert load.kv_cache_usage is None  # this build has no kv_cache_usage_ratio: not reported as 0


def _raised(exc: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as c:
            raise exc from c
    except BaseException as e:
        return e


@pytest.mark.parametrize(
    ("cause", "kind"),
    [
        (_raised(EngineUnreachable("cannot connect"), ConnectionRefusedError(111, "Connection refused")), "refused"),
        (_raised(EngineUnreachable("connect timed out"), TimeoutError()), "timeout"),
        (EngineStreamBroken("connection closed mid-body"), "broken"),
        (_raised(EngineUnreachable("cannot connect"), OSError(101, "Network is unreachable")), "other"),
    ],
)
def test_why_the_engine_gave_no_answer(cause: BaseException, kind: str) -> None:
    err = _raised(EngineRequestError(0, f"engine unreachable: {cause}"), cause)
    assert a.failure_kind(err) == kind


def _samples(adapter: a.LocalServerAdapter, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in adapter.collectors():
        for metric in c.collect():  # type: ignore[attr-defined]
            for s in metric.samples:
                if s.name == name:
                    out[s.labels.get("kind", "")] = s.value
    return out


def test_the_model_load_is_timed_from_the_first_loading_answer_to_the_first_ready_one() -> None:
    adapter = a.LlamaCppAdapter("http://127.0.0.1:1", 4)
    for at, state in [(0.0, "down"), (1.0, "loading"), (1.5, "loading"), (4.0, "ready"), (5.0, "ready")]:
        adapter.observe_state(state, at)  # type: ignore[arg-type]
        assert _samples(adapter, "llmlab_worker_engine_loading")[""] == (1.0 if state == "loading" else 0.0)
    assert _samples(adapter, "llmlab_worker_engine_model_load_seconds_count") == {"startup": 1.0}
    assert _samples(adapter, "llmlab_worker_engine_model_load_seconds_sum") == {"startup": 3.0}
    # down before ready (the server died while loading): no load to report
    adapter.observe_state("loading", 10.0)
    adapter.observe_state("down", 11.0)
    adapter.observe_state("ready", 12.0)
    assert _samples(adapter, "llmlab_worker_engine_model_load_seconds_count") == {"startup": 1.0}
