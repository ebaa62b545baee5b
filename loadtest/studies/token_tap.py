"""Count, for 10 s, the token messages that reach every gateway on this NATS: per-gateway batches
(``<ns>.tok.<gw>._batch``, with the lines they carry) apart from lone messages. Used by
results/relay-token-batches/20261203 (run beside relay_cpu_split.py).

    python loadtest/studies/token_tap.py [NATS_URL]"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from llmlab_common.natsio import connect


async def main(nats_url: str) -> None:
    nc = await connect(nats_url, "token-tap")
    counts = {"batch": 0, "lines": 0, "single": 0}

    async def on_message(m: Any) -> None:  # a nats-py Msg
        if m.subject.endswith("._batch"):
            counts["batch"] += 1
            counts["lines"] += m.data.count(b"\n") + 1
        else:
            counts["single"] += 1

    await nc.subscribe("*.tok.*.*", cb=on_message)
    await asyncio.sleep(10)
    print(counts)
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "nats://127.0.0.1:4222"))
