"""What the kernel alone charges per token on this host: the CPU of one paced 200-byte loopback TCP
send (the gateway's one write per token to its client), of one recv woken by such a send (the
worker's one read per engine chunk), and of one short timer sleep (a wake with nothing else to do).
No Python framework is involved: the figures are the floor under issue 34's per-token target.

    python loadtest/studies/syscall_floor.py [--n 20000] [--pace-us 200] > result.json

Sender and reader are two processes (the reader forked), so each wake is a real cross-process one,
as between the stack's processes. CPU is getrusage (user + system) around each call for the send,
and over the reader's whole loop divided by its recvs; the sleep figure is the loop's CPU divided
by its iterations. Run it on an idle host: it measures the host, not the code."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import socket
import sys
import time


def cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--pace-us", type=float, default=200.0, help="sleep between sends, so each recv waits")
    args = p.parse_args()
    pace = args.pace_us / 1e6
    out: dict[str, object] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "n": args.n,
        "pace_us": args.pace_us,
    }
    t = cpu_s()
    for _ in range(args.n):
        time.sleep(pace)
    out["sleep_us"] = (cpu_s() - t) / args.n * 1e6

    t = cpu_s()
    for _ in range(args.n):
        os.getpid()
    out["getpid_us"] = (cpu_s() - t) / args.n * 1e6

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        c = socket.create_connection(srv.getsockname())
        n, t = 0, cpu_s()
        while c.recv(65536):
            n += 1
        os.write(w, json.dumps({"recvs": n, "recv_us": (cpu_s() - t) / max(n, 1) * 1e6}).encode())
        os._exit(0)
    s, _ = srv.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"x" * 200
    spent = 0.0
    for _ in range(args.n):
        a = cpu_s()
        s.send(msg)
        spent += cpu_s() - a
        time.sleep(pace)
    s.close()
    os.waitpid(pid, 0)
    out["send_us"] = spent / args.n * 1e6
    out.update(json.loads(os.read(r, 4096)))
    sys.stdout.write(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
