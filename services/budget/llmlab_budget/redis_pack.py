"""Redis commands packed by hiredis in C, argument conversion included.

redis-py converts each argument in Python (``Encoder.encode``, a generator over the arguments)
before handing them to hiredis: 29 µs for a reserve's EVALSHA of 49 arguments, against 5 µs for
``hiredis.pack_command`` alone, which converts str, bytes, int and float itself. Every reserve
and settle pays it, and the budget's profile under load put 18% of its samples there
(``results/relay-cost/20261207T122305Z/profiles/budget-2tok.txt``).

The fast path takes only what packs to the same bytes: a command name without a space (redis-py
splits "CONFIG GET" into two arguments) and arguments hiredis accepts (it refuses bool, which
redis-py refuses too, and memoryview / bytearray, which redis-py converts). Anything else goes
the usual way. hiredis writes a str as UTF-8, strictly: a pool configured with another encoding
keeps redis-py's packing.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio import BlockingConnectionPool


class PackInC:
    """Mixed in before a redis-py asyncio connection class."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if args and isinstance(args[0], str) and " " not in args[0]:
            try:
                return [hiredis.pack_command(args)]
            except TypeError:  # an argument hiredis does not take: redis-py's way decides
                pass
        return super().pack_command(*args)  # type: ignore[misc]


def pack_in_c(pool: BlockingConnectionPool) -> BlockingConnectionPool:
    """The pool's connections (of whatever class its URL chose: TCP, TLS, Unix socket) pack in C."""
    base = pool.connection_class
    kw = pool.connection_kwargs
    utf8 = kw.get("encoding", "utf-8").lower().replace("_", "-") in ("utf-8", "utf8")
    if utf8 and kw.get("encoding_errors", "strict") == "strict" and not issubclass(base, PackInC):
        pool.connection_class = type(f"PackInC{base.__name__}", (PackInC, base), {})
    return pool
