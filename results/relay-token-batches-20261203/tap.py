import asyncio, nats
async def main():
    nc = await nats.connect("nats://127.0.0.1:4222")
    c = {"batch": 0, "lines": 0, "single": 0}
    async def cb(m):
        if m.subject.endswith("._batch"):
            c["batch"] += 1; c["lines"] += m.data.count(b"\n") + 1
        else:
            c["single"] += 1
    await nc.subscribe("*.tok.*.*", cb=cb)
    await asyncio.sleep(10)
    print(c)
    await nc.close()
asyncio.run(main())
