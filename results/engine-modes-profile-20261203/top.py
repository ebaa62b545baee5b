"""Share of GIL-held samples by the package of the innermost frame, and the top leaf functions, per
py-spy raw profile (``python top.py profiles/*.txt``)."""
import re, sys, collections
def pkg(frame):
    m = re.search(r"\((.*?):\d+\)", frame)
    path = m.group(1) if m else frame
    for key in ("llmlab_", "vllm", "nats", "aiohttp", "pydantic", "asyncio", "uvloop", "starlette", "fastapi", "uvicorn",
                "transformers", "tokenizers", "zmq", "msgspec", "torch", "prometheus_client", "orjson", "json"):
        if key in path:
            return key.rstrip("_") if key != "llmlab_" else "llmlab (ours)"
    return "other"
for f in sys.argv[1:]:
    by, leaf, total = collections.Counter(), collections.Counter(), 0
    for line in open(f):
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack: continue
        n = int(n); total += n
        frames = stack.split(";")
        by[pkg(frames[-1])] += n
        leaf[re.sub(r" \(.*", "", frames[-1]) + " " + pkg(frames[-1])] += n
    print(f"== {f}: {total} samples")
    print("   by package: " + ", ".join(f"{k} {100*v/total:.0f}%" for k, v in by.most_common(8)))
    print("   top leaves: " + "; ".join(f"{k} {100*v/total:.0f}%" for k, v in leaf.most_common(6)))
