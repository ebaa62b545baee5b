"""SSE load client for OpenAI-compatible streaming chat completions.

k6 has no SSE module, so this is our own: asyncio + aiohttp, one process, N concurrent streams.

    python -m llmlab_loadtest.sse_client --url http://127.0.0.1:8080/v1/chat/completions \\
        --model meta-llama/Llama-3.1-8B-Instruct --api-key sk-llmlab-dev \\
        --concurrency 1000 --requests-per-stream 1 --max-tokens 256 --out run.json

Each of ``--concurrency`` streams sends ``--requests-per-stream`` streamed chat requests one after
the other (``stream: true``, ``stream_options.include_usage: true``). Per request it records the
send time, the arrival time of every SSE chunk that carries content, the HTTP status, the
finish_reason, the usage block, and an error classified as ``timeout``, ``http`` (non-200 status),
``connection`` (connect failed / connection dropped) or ``stream`` (in-band error event, broken
body, no ``[DONE]``).

Summary (vLLM benchmark conventions): TTFT = send -> first content chunk; ITL = gaps between
consecutive content chunks, pooled over all requests; TPOT = (e2e - ttft) / (output_tokens - 1)
per request; delivered tokens/s = sum of ``usage.completion_tokens`` / wall time of the measured
window (first send -> last response end). The client's own CPU seconds (getrusage) and peak RSS
are in the summary so a saturated client is visible (cpu_util close to 1.0 = one full core).

Importable: :func:`run_load` (async) / :func:`run` (sync) return a :class:`LoadResult`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from llmlab_common.stats import quantile

log = logging.getLogger("sse_client")

ERROR_KINDS = ("timeout", "http", "connection", "stream")
DEFAULT_PROMPT = "Write a long story about a lighthouse keeper who collects clocks."


# ---------------------------------------------------------------------------------------------
# Configuration and per-request records
# ---------------------------------------------------------------------------------------------
@dataclass
class LoadConfig:
    url: str
    model: str
    api_key: str | None = None
    concurrency: int = 1
    requests_per_stream: int = 1
    max_tokens: int = 256
    prompt: str = DEFAULT_PROMPT
    temperature: float | None = None
    # Whole request (send -> last byte); the idle read timeout catches a stalled stream sooner.
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 60.0
    read_timeout_s: float = 120.0
    # Spread the streams' first sends evenly over this many seconds (0: all at once).
    ramp_s: float = 0.0
    read_bufsize: int = 1 << 20
    label: str = ""


@dataclass
class RequestRecord:
    """One request. Times are seconds: ``sent_at`` since the run started, the others since ``sent_at``."""

    index: int
    stream: int
    sent_at: float
    status: int | None = None
    headers_at: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # content-carrying chunks only
    end_at: float | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False  # saw ``data: [DONE]``
    error_kind: str | None = None
    error: str | None = None
    request_id: str | None = None  # the gateway's x-request-id

    @property
    def ok(self) -> bool:
        return self.error_kind is None and self.status == 200 and self.finish_reason is not None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def e2e(self) -> float | None:
        return self.end_at

    @property
    def output_tokens(self) -> int | None:
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return int(self.usage["completion_tokens"])
        return None

    def itls(self) -> list[float]:
        t = self.chunk_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    def tpot(self) -> float | None:
        n, ttft, e2e = self.output_tokens, self.ttft, self.e2e
        if n is None or n < 2 or ttft is None or e2e is None:
            return None
        return (e2e - ttft) / (n - 1)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["sent_at"] = round(self.sent_at, 6)
        d["chunk_times"] = [round(t, 6) for t in self.chunk_times]
        d["ok"] = self.ok
        return d


@dataclass
class ClientUsage:
    cpu_user_s: float
    cpu_sys_s: float
    max_rss_mb: float

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_sys_s


def client_usage() -> ClientUsage:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ClientUsage(ru.ru_utime, ru.ru_stime, ru.ru_maxrss / 1024.0)  # ru_maxrss is KiB on Linux


@dataclass
class LoadResult:
    config: LoadConfig
    started_at_unix: float
    window_s: float
    records: list[RequestRecord]
    cpu_window: ClientUsage  # CPU spent during the measured window
    cpu_total: ClientUsage  # the whole process so far (imports, setup, parsing)
    summary: dict[str, Any]

    def to_json(self, include_requests: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "config": asdict(self.config),
            "started_at_unix": self.started_at_unix,
            "summary": self.summary,
        }
        if include_requests:
            out["requests"] = [r.to_json() for r in self.records]
        return out


# ---------------------------------------------------------------------------------------------
# Pure statistics (unit-tested)
# ---------------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default ``linear`` method). None for no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    if not values:
        return None
    return quantile(sorted(values), q / 100.0)


def distribution_ms(values_s: Iterable[float], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float | None]:
    """p50/p95/p99 (and mean, max) of values in seconds, reported in milliseconds."""
    data = sorted(values_s)
    out: dict[str, float | None] = {}
    for q in qs:
        p = percentile(data, q)
        out[f"p{q:g}"] = None if p is None else round(p * 1000.0, 3)
    out["mean"] = round(sum(data) / len(data) * 1000.0, 3) if data else None
    out["max"] = round(data[-1] * 1000.0, 3) if data else None
    out["n"] = len(data)
    return out


def measured_window(records: Sequence[RequestRecord]) -> float:
    """First send to last response end (seconds) over all requests; 0 when nothing ended."""
    ends = [r.sent_at + r.end_at for r in records if r.end_at is not None]
    if not records or not ends:
        return 0.0
    return max(0.0, max(ends) - min(r.sent_at for r in records))


def summarize(
    records: Sequence[RequestRecord],
    window_s: float | None = None,
    cpu: ClientUsage | None = None,
    cpu_total: ClientUsage | None = None,
) -> dict[str, Any]:
    """The run's summary. Latency figures use successful requests only; tokens count every
    request that reported usage (a request that failed after its usage chunk still delivered)."""
    ok = [r for r in records if r.ok]
    window = measured_window(records) if window_s is None else window_s
    errors: dict[str, int] = dict.fromkeys(ERROR_KINDS, 0)
    samples: dict[str, list[str]] = {}
    for r in records:
        if r.error_kind is not None:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
            msgs = samples.setdefault(r.error_kind, [])
            if len(msgs) < 3 and r.error and r.error not in msgs:
                msgs.append(r.error)
        elif not r.ok:
            errors["stream"] += 1
    ttfts = [t for r in ok if (t := r.ttft) is not None]
    e2es = [t for r in ok if (t := r.e2e) is not None]
    tpots = [t for r in ok if (t := r.tpot()) is not None]
    itls = [g for r in ok for g in r.itls()]
    tokens = sum(n for r in records if (n := r.output_tokens) is not None)
    prompts = [
        int(r.usage["prompt_tokens"]) for r in records if r.usage and isinstance(r.usage.get("prompt_tokens"), int)
    ]
    chunks = sum(len(r.chunk_times) for r in ok)
    ok_tokens = sum(r.output_tokens or 0 for r in ok)
    finish: dict[str, int] = {}
    for r in ok:
        finish[str(r.finish_reason)] = finish.get(str(r.finish_reason), 0) + 1
    summary: dict[str, Any] = {
        "requests": {"total": len(records), "ok": len(ok), "failed": len(records) - len(ok)},
        "errors": errors,
        "error_samples": samples,
        "finish_reasons": finish,
        "ttft_ms": distribution_ms(ttfts),
        "itl_ms": distribution_ms(itls),
        "tpot_ms": distribution_ms(tpots),
        "e2e_ms": distribution_ms(e2es),
        "output_tokens": tokens,
        "prompt_tokens": {"min": min(prompts), "max": max(prompts)} if prompts else None,
        "content_chunks": chunks,
        "tokens_per_chunk": round(ok_tokens / chunks, 4) if chunks else None,
        "window_s": round(window, 4),
        "output_tokens_per_s": round(tokens / window, 2) if window > 0 else None,
    }
    if cpu is not None:
        summary["client"] = {
            "cpu_s": round(cpu.cpu_s, 3),
            "cpu_user_s": round(cpu.cpu_user_s, 3),
            "cpu_sys_s": round(cpu.cpu_sys_s, 3),
            # Fraction of one core used during the window: ~1.0 means the client is the bottleneck.
            "cpu_util": round(cpu.cpu_s / window, 3) if window > 0 else None,
            "cpu_total_s": round(cpu_total.cpu_s, 3) if cpu_total is not None else None,
            "max_rss_mb": round((cpu_total or cpu).max_rss_mb, 1),
            "pid": os.getpid(),
        }
    return summary


# ---------------------------------------------------------------------------------------------
# SSE parsing
# ---------------------------------------------------------------------------------------------
class SSEParser:
    """Splits a byte stream into SSE events and hands back their ``data:`` payloads."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events = buf.split(b"\n\n")
        self._buf = events.pop()
        out: list[bytes] = []
        for ev in events:
            if not ev:
                continue
            lines = [ln[5:].lstrip(b" ") for ln in ev.split(b"\n") if ln.startswith(b"data:")]
            if lines:
                out.append(b"\n".join(lines))
        return out

    def close(self) -> list[bytes]:
        """Whatever complete-looking event is left without its blank line."""
        rest, self._buf = self._buf, b""
        return self.feed(rest + b"\n\n") if rest.strip() else []


_CONTENT_KEY = b'"content":"'
_NO_FINISH = b'"finish_reason":null'
_SLOW_KEYS = (b'"usage":{', b'"error":', b'"tool_calls":')


def _plain_content_chunk(payload: bytes) -> bool | None:
    """Fast path for the common case, a compact-JSON delta with text and nothing else: True (has
    content), False (empty content), None (anything else: parse it). An unescaped ``"key":``
    pattern cannot occur inside a JSON string value, so the byte tests only match structure."""
    i = payload.find(_CONTENT_KEY)
    if i < 0 or _NO_FINISH not in payload or any(k in payload for k in _SLOW_KEYS):
        return None
    return payload[i + len(_CONTENT_KEY)] != 0x22  # 0x22 = '"': the empty string


def http_error_code(error: str | None) -> str | None:
    """The OpenAI error code in a record's ``http`` error (``HTTP <status>: <body>``); None when
    the body carries none."""
    try:
        return str(json.loads((error or "").split(": ", 1)[-1])["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def apply_event(rec: RequestRecord, payload: bytes, at: float) -> None:
    """Fold one SSE ``data:`` payload into the record (``at``: seconds since the send)."""
    if payload == b"[DONE]":
        rec.done = True
        return
    plain = _plain_content_chunk(payload)
    if plain is not None:
        if plain:
            rec.chunk_times.append(at)
        return
    try:
        obj = json.loads(payload)
    except ValueError:
        rec.error_kind, rec.error = "stream", f"malformed SSE data: {payload[:200]!r}"
        return
    if not isinstance(obj, dict):
        return
    if "error" in obj and not obj.get("choices"):
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        code = err.get("code") if isinstance(err, dict) else None
        rec.error_kind, rec.error = "stream", f"in-band error ({code}): {msg}"[:500]
        return
    usage = obj.get("usage")
    if usage:
        rec.usage = usage
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        text = delta.get("content") if "delta" in choice else choice.get("text")
        if text or delta.get("tool_calls"):
            rec.chunk_times.append(at)
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]


# ---------------------------------------------------------------------------------------------
# The load
# ---------------------------------------------------------------------------------------------
def _body(cfg: LoadConfig, index: int) -> bytes:
    body: dict[str, Any] = {
        "model": cfg.model,
        "messages": [{"role": "user", "content": f"{cfg.prompt} (request {index})"}],
        "max_tokens": cfg.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    return json.dumps(body).encode()


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes | dict[str, Any],
    rec: RequestRecord,
    t_run0: float,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> None:
    """POST one streaming request and fill ``rec`` (status, chunk times, usage, finish reason or the
    error kind). Shared by the load client, the twin's real-time replay and its CPU calibration."""
    parser = SSEParser()
    clock = time.perf_counter
    t0 = clock()
    rec.sent_at = t0 - t_run0
    kw: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, headers=headers, **kw) as resp:
                rec.status = resp.status
                rec.headers_at = clock() - t0
                rec.request_id = resp.headers.get("x-request-id")
                if resp.status != 200:
                    text = (await resp.content.read(2000)).decode(errors="replace")
                    rec.error_kind, rec.error = "http", f"HTTP {resp.status}: {text[:300]}"
                    return
                async for data in resp.content.iter_any():
                    at = clock() - t0
                    for payload in parser.feed(data):
                        apply_event(rec, payload, at)
                at = clock() - t0
                for payload in parser.close():
                    apply_event(rec, payload, at)
        if rec.error_kind is None and not rec.done:
            rec.error_kind, rec.error = "stream", "stream ended without data: [DONE]"
        elif rec.error_kind is None and rec.finish_reason is None:
            rec.error_kind, rec.error = "stream", "stream ended without a finish_reason"
    except TimeoutError as exc:  # asyncio.timeout, aiohttp's connect/read timeouts
        what = type(exc).__name__
        rec.error_kind, rec.error = "timeout", f"{what} after {clock() - t0:.1f}s: {exc}"[:500]
    except aiohttp.ClientPayloadError as exc:
        rec.error_kind, rec.error = "stream", f"broken response body: {exc}"[:500]
    except (aiohttp.ClientConnectionError, OSError) as exc:
        rec.error_kind, rec.error = "connection", f"{type(exc).__name__}: {exc}"[:500]
    except aiohttp.ClientError as exc:
        rec.error_kind, rec.error = "connection", f"{type(exc).__name__}: {exc}"[:500]
    finally:
        rec.end_at = clock() - t0


async def _one_request(
    session: aiohttp.ClientSession, cfg: LoadConfig, headers: dict[str, str], rec: RequestRecord, t_run0: float
) -> None:
    await stream_request(session, cfg.url, _body(cfg, rec.index), rec, t_run0, cfg.request_timeout_s, headers)


async def _stream_worker(
    session: aiohttp.ClientSession,
    cfg: LoadConfig,
    headers: dict[str, str],
    stream: int,
    records: list[RequestRecord],
    t_run0: float,
    progress: _Progress,
) -> None:
    if cfg.ramp_s > 0 and cfg.concurrency > 1:
        await asyncio.sleep(cfg.ramp_s * stream / cfg.concurrency)
    for k in range(cfg.requests_per_stream):
        rec = RequestRecord(index=stream * cfg.requests_per_stream + k, stream=stream, sent_at=0.0)
        records.append(rec)
        progress.in_flight += 1
        try:
            await _one_request(session, cfg, headers, rec, t_run0)
        finally:
            progress.in_flight -= 1
            progress.done += 1
            progress.failed += 0 if rec.ok else 1


@dataclass
class _Progress:
    in_flight: int = 0
    done: int = 0
    failed: int = 0


async def _report_progress(progress: _Progress, total: int, t0: float, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        log.info(
            "%.1fs: %d/%d done (%d failed), %d in flight",
            time.perf_counter() - t0,
            progress.done,
            total,
            progress.failed,
            progress.in_flight,
        )


async def run_load(cfg: LoadConfig, progress_every_s: float = 0.0) -> LoadResult:
    """Run the load described by ``cfg`` and return every request's record plus the summary."""
    if cfg.concurrency < 1 or cfg.requests_per_stream < 1:
        raise ValueError("concurrency and requests_per_stream must be >= 1")
    raise_nofile_limit(cfg.concurrency + 64)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    # limit=0: no cap on connections (the default pool of 100 would silently serialise the load).
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s)
    records: list[RequestRecord] = []
    progress = _Progress()
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        read_bufsize=cfg.read_bufsize,
        auto_decompress=False,
        raise_for_status=False,
    ) as session:
        started_at_unix = time.time()
        cpu0 = client_usage()
        t0 = time.perf_counter()
        reporter = (
            asyncio.create_task(
                _report_progress(progress, cfg.concurrency * cfg.requests_per_stream, t0, progress_every_s)
            )
            if progress_every_s > 0
            else None
        )
        try:
            await asyncio.gather(
                *[_stream_worker(session, cfg, headers, s, records, t0, progress) for s in range(cfg.concurrency)]
            )
        finally:
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
        cpu1 = client_usage()
    records.sort(key=lambda r: r.index)
    cpu_window = ClientUsage(cpu1.cpu_user_s - cpu0.cpu_user_s, cpu1.cpu_sys_s - cpu0.cpu_sys_s, cpu1.max_rss_mb)
    window = measured_window(records)
    summary = summarize(records, window, cpu_window, cpu1)
    return LoadResult(cfg, started_at_unix, window, records, cpu_window, cpu1, summary)


def run(cfg: LoadConfig, progress_every_s: float = 0.0) -> LoadResult:
    """Synchronous :func:`run_load` on a fresh event loop (uvloop when installed)."""
    return _run_loop(run_load(cfg, progress_every_s))


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def raise_nofile_limit(wanted: int | None = None) -> int:
    """Raise the soft open-files limit (up to the hard limit); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if wanted is None or hard == resource.RLIM_INFINITY else max(soft, min(hard, wanted * 2))
    if hard == resource.RLIM_INFINITY and wanted is not None:
        target = max(soft, wanted * 2)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if wanted is not None and soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning("open-files limit %d is below the %d sockets this run needs", soft, wanted)
    return soft


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="full URL of the chat completions endpoint")
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--concurrency", type=int, default=1, help="concurrent streams")
    p.add_argument("--requests-per-stream", type=int, default=1, help="requests each stream sends, one after another")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--temperature", type=float)
    p.add_argument("--timeout", type=float, default=600.0, help="per request, send to last byte (s)")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument("--read-timeout", type=float, default=120.0, help="longest silence inside a stream (s)")
    p.add_argument("--ramp", type=float, default=0.0, help="spread the first sends over this many seconds")
    p.add_argument("--read-bufsize", type=int, default=1 << 20)
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path, help="write raw per-request records + summary here (JSON)")
    p.add_argument("--summary-only", action="store_true", help="leave the per-request records out of --out")
    p.add_argument("--progress", type=float, default=0.0, help="log progress to stderr every N seconds")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s sse_client %(levelname)s %(message)s"
    )
    cfg = LoadConfig(
        url=args.url,
        model=args.model,
        api_key=args.api_key,
        concurrency=args.concurrency,
        requests_per_stream=args.requests_per_stream,
        max_tokens=args.max_tokens,
        prompt=args.prompt,
        temperature=args.temperature,
        request_timeout_s=args.timeout,
        connect_timeout_s=args.connect_timeout,
        read_timeout_s=args.read_timeout,
        ramp_s=args.ramp,
        read_bufsize=args.read_bufsize,
        label=args.label,
    )
    result: LoadResult = run(cfg, args.progress)
    out = result.to_json(include_requests=not args.summary_only)
    out["argv"] = [sys.executable, *sys.argv] if argv is None else ["sse_client.py", *argv]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(out, separators=(",", ":")))
        tmp.replace(args.out)
    s = result.summary
    keys = ("requests", "errors", "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "output_tokens_per_s", "window_s", "client")
    sys.stdout.write(json.dumps({k: s[k] for k in keys if k in s}, indent=1) + "\n")
    return 0 if s["requests"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
