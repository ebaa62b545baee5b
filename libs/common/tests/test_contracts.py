from __future__ import annotations

import pytest
from llmlab_common.errors import InvalidRequest, RateLimited, ServiceUnavailable, error_from_info
from llmlab_common.messages import (
    STREAM_MESSAGE,
    StreamEnd,
    Timings,
    TokenChunk,
    Usage,
    join_batch,
    split_batch,
    token_chunk_json,
)
from llmlab_common.metrics import Metrics, parse_prometheus_text
from llmlab_common.subjects import PRIORITY_LEVELS, Topology, attempt_msg_id

pytestmark = pytest.mark.unit


def test_subjects_are_namespaced_and_pool_filters_never_overlap() -> None:
    t = Topology("abc")
    assert t.pool_subject("p1") == "abc.req.pool.p1"
    assert t.worker_subject("p1", "w1") == "abc.req.worker.p1.w1"
    assert t.requests_stream == "ABC_REQUESTS"
    # a work-queue stream refuses overlapping consumer filters: pool vs worker subjects differ in
    # their second token, so no wildcard of one can match the other
    assert not t.worker_subject("p1", "w1").startswith(t.pool_subject("p1"))
    with pytest.raises(ValueError):
        t.pool_subject("bad.pool")
    with pytest.raises(ValueError):
        t.token_subject("gw", "id>")


def test_each_plan_priority_has_its_own_pool_queue() -> None:
    t = Topology("abc")
    assert [t.pool_subject("p1", p) for p in range(PRIORITY_LEVELS)] == [
        "abc.req.pool.p1",
        "abc.req.pool.p1.p1",
        "abc.req.pool.p1.p2",
        "abc.req.pool.p1.p3",
    ]
    assert [t.pool_consumer("p1", p) for p in (0, 2)] == ["pool-p1", "pool-p1-p2"]
    # Every queue counts toward its pool's backlog (the router's gauges), nothing else does.
    assert [t.request_subject_pool(t.pool_subject("gpu", p)) for p in range(PRIORITY_LEVELS)] == ["gpu"] * 4
    assert t.request_subject_pool("abc.req.pool.gpu.x2") is None
    # A worker's own queue has one per priority too.
    assert t.worker_subject("gpu", "w1", 2) == "abc.req.worker.gpu.w1.p2"
    assert t.worker_consumer("w1", 2) == "worker-w1-p2" and t.worker_consumer("w1") == "worker-w1"
    assert t.request_subject_pool(t.worker_subject("gpu", "w1", 3)) == "gpu"
    for bad in (-1, PRIORITY_LEVELS):
        with pytest.raises(ValueError):
            t.pool_subject("p1", bad)


def test_token_batches_have_their_own_subject_per_gateway() -> None:
    t = Topology("abc")
    assert t.batch_subject_for(t.token_subject("gw1", "r1")) == t.token_batch_subject("gw1") == "abc.tok.gw1._batch"
    assert t.batch_subject_for("abc.tok.gw1") is None  # no request part
    assert t.batch_subject_for("abc.tok.gw1.r1.x") is None
    assert t.batch_subject_for("other.tok.gw1.r1") is None  # another namespace
    assert t.batch_subject_for("abc.ctl.cancel") is None
    with pytest.raises(ValueError, match="reserved"):
        t.token_subject("gw1", "_batch")


def test_a_batch_splits_back_into_its_messages_in_order() -> None:
    msgs = [TokenChunk(request_id=r, attempt=1, seq=i, text="a\nb", token_times=[0.1]) for i, r in enumerate("xyx")]
    lines = split_batch(join_batch([m.model_dump_json().encode() for m in msgs]))
    assert [STREAM_MESSAGE.validate_json(line) for line in lines] == msgs  # a newline in text stays escaped


def test_retry_attempts_get_distinct_dedup_ids() -> None:
    assert attempt_msg_id("r", 1) != attempt_msg_id("r", 2)


def test_stream_messages_round_trip_by_kind() -> None:
    chunk = TokenChunk(request_id="r", attempt=2, seq=3, text="hi", token_times=[0.1, 0.15])
    end = StreamEnd(
        request_id="r",
        attempt=2,
        seq=4,
        finish_reason="length",
        usage=Usage(prompt_tokens=3),
        timings=Timings(nats_queue_s=0.001, e2e_s=1.0),
    )
    assert STREAM_MESSAGE.validate_json(chunk.model_dump_json()) == chunk
    assert STREAM_MESSAGE.validate_json(end.model_dump_json()) == end
    assert chunk.schema_version == 1


def test_the_hand_written_token_chunk_is_the_models_wire_form() -> None:
    """The worker writes token messages without the model: the gateway must parse them into the
    very TokenChunk the model would have sent (text with quotes, newlines and non-ASCII; tool
    calls only when there are some; no newline that would split a batch)."""
    text = 'say "hi"\n\u00e9\u4e2d \\ end'
    for tools in (None, [{"index": 0, "function": {"name": "f", "arguments": "{"}}]):
        raw = token_chunk_json("r1", 2, 7, text, [0.5, 0.52], 3, tools)
        model = TokenChunk(
            request_id="r1", attempt=2, seq=7, text=text, token_times=[0.5, 0.52], tokens=3, tool_calls=tools
        )
        assert STREAM_MESSAGE.validate_json(raw) == model
        assert STREAM_MESSAGE.validate_json(model.model_dump_json(exclude_none=True)) == model
        assert b"\n" not in raw and split_batch(join_batch([raw, raw])) == [raw, raw]


def test_errors_have_openai_shape_and_retry_after() -> None:
    body = InvalidRequest("bad", param="n").to_openai()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    rl = RateLimited("busy", retry_after_s=4.4)
    assert rl.status == 429 and rl.headers["Retry-After"] == "4"
    assert error_from_info(ServiceUnavailable("x").to_info()).status == 503


def test_metrics_enforce_conventions_and_parse_back() -> None:
    m = Metrics("t")
    with pytest.raises(ValueError):
        m.counter("requests", "no _total suffix")
    c = m.counter("requests_total", "ok", ("status",))
    c.labels("200").inc(3)
    body, _ = m.render()
    assert parse_prometheus_text(body.decode())["t_requests_total"] == 3
    text = 'vllm:num_requests_running{engine="0",model_name="x"} 2.0\nvllm:num_requests_running{engine="1"} 1\n'
    assert parse_prometheus_text(text)["vllm:num_requests_running"] == 3.0


def test_content_chunk_encoder_matches_the_full_chunk() -> None:
    import json

    from llmlab_common import openai_wire as wire

    for endpoint in ("chat", "completions"):
        enc = wire.ContentChunkEncoder(endpoint, "id1", 5, "m", include_usage_field=True)
        for text in ("hi", ' "quoted" \\ \n', "ünï"):
            full = wire.sse(wire.chunk(endpoint, "id1", 5, "m", text=text, include_usage_field=True))
            assert json.loads(enc.encode(text)[6:]) == json.loads(full[6:])
