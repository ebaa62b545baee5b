"""Token batches to the gateway on vs off (LLMLAB_WORKER_GATEWAY_BATCHES from env BATCHES, default
true): CPU per request of each stack process and of nats-server; adapted from
../relay-cost-split-20261203/cost_split.py (same arguments).

Usage (repository root): python cost_split.py OUT_DIR STREAMS TOKENS ITL_MS; env NOPROF=1 skips the
py-spy profiles (--gil: samples only while a thread holds the GIL), PERF=1 / STRACE=1 record perf or
strace instead. Prints requests and each process's CPU per request over a 15 s window (started 4 s
after the closed-loop client)."""
import subprocess, sys, time, signal, asyncio
from pathlib import Path
from llmlab_testkit.procs import Stack, unique_namespace, url
from llmlab_testkit.fixtures import _cleanup
from llmlab_testkit.budget import BudgetAdmin

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
streams = int(sys.argv[2])
s = Stack(namespace=unique_namespace())
try:
    sim = s.sim("vllm", "meta-llama/Llama-3.1-8B-Instruct", ttft_ms=50, itl_ms=float(sys.argv[4]), max_num_seqs=2000, output_len=int(sys.argv[3]))
    import os
    w = s.worker("vllm", "gpu-vllm", url(sim), max_concurrency=2000, heartbeat_s=1.0,
                 env={"LLMLAB_WORKER_GATEWAY_BATCHES": os.environ.get("BATCHES", "true")})
    b = s.budget(); r = s.router(); a = s.accounting()
    admin = BudgetAdmin(url(b)); u = dict.fromkeys(("daily_tokens","monthly_tokens","rpm","tpm","max_concurrent"), "unlimited")
    key = admin.provision("enterprise", {"key": u, "user": u, "team": u}).api_key
    gw = s.gateway(auth="budget", router="service")
    time.sleep(2)
    client = subprocess.Popen([sys.executable, "-m", "llmlab_loadtest.sse_client", "--url", url(gw) + "/v1/chat/completions",
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--api-key", key, "--concurrency", str(streams),
        "--requests-per-stream", "1000", "--max-tokens", sys.argv[3], "--timeout", "60", "--read-timeout", "90", "--out", str(out / "client.json"),
        "--log-level", "WARNING"])
    time.sleep(4)
    import psutil, urllib.request, re
    def reqs():
        t = urllib.request.urlopen(url(gw) + "/metrics").read().decode()
        lines = [l for l in t.splitlines() if "requests_total{" in l and not l.startswith("#")]
        return sum(float(l.rsplit(" ", 1)[1]) for l in lines if "gateway" in l.split("{")[0])
    natsp = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "nats-server"][0]
    def cpu():
        out = {n: sum(psutil.Process(p.pid).cpu_times()[:2]) for n, p in (("gateway", gw), ("worker", w), ("router", r), ("budget", b), ("sim", sim))}
        out["nats-server"] = sum(natsp.cpu_times()[:2])
        return out
    def sys_():
        out = {n: psutil.Process(p.pid).cpu_times()[1] for n, p in (("gateway", gw), ("worker", w), ("router", r), ("budget", b), ("sim", sim))}
        out["nats-server"] = natsp.cpu_times()[1]
        return out
    r0, c0, t0, s0 = reqs(), cpu(), time.time(), sys_()
    profs = []
    import os
    for name, p in (() if os.environ.get('NOPROF') else (("gateway", gw), ("worker", w), ("router", r), ("budget", b))):
        profs.append(subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(p.pid), "-d", "15",
            "-r", "100", "--format", "raw", "-o", str(out / f"{name}.txt"), "--nonblocking", "--gil"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if os.environ.get('PERF'):
        for name, p in (("gateway", gw), ("worker", w)):
            profs.append(subprocess.Popen(["perf", "record", "-F", "499", "-g", "-p", str(p.pid), "-o", str(out / f"{name}.perf"), "--", "sleep", "10"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if os.environ.get('STRACE'):
        for name, p in (("gateway", gw), ("worker", w)):
            profs.append(subprocess.Popen(["timeout", "-s", "INT", "10", "strace", "-c", "-f", "-p", str(p.pid), "-o", str(out / f"{name}.strace")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for pr in profs: pr.wait()
    if not profs: time.sleep(15)
    r1, c1, t1, s1 = reqs(), cpu(), time.time(), sys_()
    n = r1 - r0
    print(f"requests {n:.0f} in {t1-t0:.1f}s = {n/(t1-t0):.1f} req/s; tokens/req {sys.argv[3]}")
    for k in c0: print(f"  {k}: {1e3*(c1[k]-c0[k])/max(n,1):.3f} ms CPU/request, {(c1[k]-c0[k])/(t1-t0):.2f} cores; system share {(s1[k]-s0[k])/max(1e-9,c1[k]-c0[k]):.2f}")
    client.send_signal(signal.SIGINT); client.wait(30)
finally:
    s.close(); asyncio.run(_cleanup(s.namespace, s.nats_url, s.redis_url))
