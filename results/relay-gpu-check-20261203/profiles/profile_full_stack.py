"""Profile gateway and worker on the full stack, gpu-like workload (TTFT 50, ITL 20, 64 tokens)."""
import subprocess, sys, time, signal, asyncio
from pathlib import Path
from llmlab_testkit.procs import Stack, unique_namespace, url
from llmlab_testkit.fixtures import _cleanup
from llmlab_testkit.budget import BudgetAdmin

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
streams = int(sys.argv[2])
s = Stack(namespace=unique_namespace())
try:
    sim = s.sim("vllm", "meta-llama/Llama-3.1-8B-Instruct", ttft_ms=50, itl_ms=20, max_num_seqs=2000, output_len=64)
    w = s.worker("vllm", "gpu-vllm", url(sim), max_concurrency=2000, heartbeat_s=1.0)
    b = s.budget(); r = s.router(); a = s.accounting()
    admin = BudgetAdmin(url(b)); u = dict.fromkeys(("daily_tokens","monthly_tokens","rpm","tpm","max_concurrent"), "unlimited")
    key = admin.provision("enterprise", {"key": u, "user": u, "team": u}).api_key
    gw = s.gateway(auth="budget", router="service")
    time.sleep(2)
    client = subprocess.Popen([sys.executable, "-m", "llmlab_loadtest.sse_client", "--url", url(gw) + "/v1/chat/completions",
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--api-key", key, "--concurrency", str(streams),
        "--requests-per-stream", "1000", "--max-tokens", "64", "--timeout", "60", "--read-timeout", "90", "--out", str(out / "client.json"),
        "--log-level", "WARNING"])
    time.sleep(4)
    profs = []
    for name, p in (("gateway", gw), ("worker", w), ("router", r), ("budget", b)):
        profs.append(subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(p.pid), "-d", "15",
            "-r", "100", "--format", "raw", "-o", str(out / f"{name}.txt"), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for pr in profs: pr.wait()
    client.send_signal(signal.SIGINT); client.wait(30)
finally:
    s.close(); asyncio.run(_cleanup(s.namespace, s.nats_url, s.redis_url))
