"""Token counting rule, deterministic text, stop strings, request parsing and the CLI."""

from __future__ import annotations

import pytest
from llmlab_engine_sim import textgen
from llmlab_engine_sim.__main__ import parse_args
from llmlab_engine_sim.protocol import ApiError, parse_generation
from llmlab_engine_sim.settings import SimSettings

pytestmark = pytest.mark.unit


def test_counting_rule() -> None:
    assert textgen.count_text_tokens("Hello, world!") == 4
    assert textgen.count_text_tokens("  ") == 0
    messages = [
        {"role": "system", "content": "Be brief."},  # 3
        {"role": "user", "content": [{"type": "text", "text": "Hi there"}, {"type": "image_url"}]},  # 2
    ]
    assert textgen.count_chat_tokens(messages) == 3 + (4 + 3) + (4 + 2)
    assert len(textgen.tokenize_chat(messages)) == textgen.count_chat_tokens(messages)
    ids = textgen.tokenize_text("a b a")
    assert len(ids) == 3 and ids[0] == ids[2] != ids[1]


def test_text_is_deterministic_and_prefix_stable() -> None:
    key = textgen.prompt_key([{"role": "user", "content": "x"}])
    seed = textgen.text_seed(0, key, None)
    a = textgen.generate_tokens(20, seed)
    assert a == textgen.generate_tokens(20, seed)
    assert textgen.generate_tokens(5, seed) == a[:5]
    assert all(t.startswith(" ") and t[1:].isalpha() for t in a)
    assert textgen.text_seed(0, key, 7) != seed and textgen.text_seed(1, key, None) != seed


@pytest.mark.parametrize(
    ("stop", "pieces"),
    [
        (["bc"], [" a", " "]),  # cut inside a token
        ([" bc"], [" a", ""]),  # the stop is exactly a token: it is generated, not shown
        (["a b"], [" ", ""]),  # spans two tokens
        (["zz", " d"], [" a", " bc", ""]),  # the earliest of several
        (["zz"], [" a", " bc", " d", " e"]),  # absent: unchanged
    ],
)
def test_apply_stop(stop: list[str], pieces: list[str]) -> None:
    out, stopped = textgen.apply_stop([" a", " bc", " d", " e"], stop)
    assert out == pieces
    assert stopped == (stop != ["zz"])


def _parse(body: bytes, endpoint: str = "chat") -> object:
    return parse_generation(endpoint, body, "m", 100)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{", 400),
        (b"[]", 400),
        (b'{"model": "other", "messages": [{"role": "user", "content": "x"}]}', 404),
        (b'{"messages": []}', 400),
        (b'{"messages": [{"content": "x"}]}', 400),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 95}', 400),  # 8 + 95 > 100
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', 400),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}', 400),
        (b'{"messages": [{"role": "user", "content": "' + b"w " * 100 + b'"}]}', 400),
    ],
)
def test_invalid_requests(body: bytes, status: int) -> None:
    with pytest.raises(ApiError) as exc:
        _parse(body)
    assert exc.value.status == status
    err = exc.value.body()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status


def test_valid_request_ignores_sampling_params() -> None:
    parsed = parse_generation(
        "completions",
        b'{"model": "m", "prompt": ["Hello, world!"], "max_tokens": 5, "temperature": 0.2, "top_p": 0.9,'
        b' "seed": 3, "stop": "x", "stream": true, "stream_options": {"include_usage": true}, "logprobs": null,'
        b' "presence_penalty": 0, "frequency_penalty": 0, "user": "u", "priority": 2}',
        "m",
        100,
    )
    assert (parsed.prompt_tokens, parsed.max_tokens, parsed.seed, parsed.stop) == (4, 5, 3, ["x"])
    assert parsed.stream and parsed.include_usage and parsed.priority == 2
    assert parse_generation("completions", b'{"prompt": [1, 2, 3]}', "m", 100).prompt_tokens == 3


def test_cli_overrides_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMLAB_SIM_ITL_MS", "7")
    argv = ["--flavor", "sglang", "--port", "8002", "--model", "N", "--ttft-ms", "100", "--max-num-seqs", "4"]
    kwargs = parse_args([*argv, "--output-len", "64"])
    assert kwargs == {
        "flavor": "sglang",
        "port": 8002,
        "model": "N",
        "ttft_ms": 100.0,
        "max_num_seqs": 4,
        "output_len": 64,
    }
    settings = SimSettings(**kwargs)
    assert (settings.flavor, settings.port, settings.itl_ms, settings.output_len) == ("sglang", 8002, 7.0, 64)
