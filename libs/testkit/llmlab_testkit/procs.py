"""Start services as separate processes (``python -m ...``), the way they run in production."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from llmlab_common.natsio import connect, delete_streams
from llmlab_common.subjects import Topology
from redis.asyncio import Redis

log = logging.getLogger(__name__)

LOG_DIR = Path(os.environ.get("LLMLAB_TEST_LOG_DIR", tempfile.gettempdir())) / "llmlab-test-logs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 15.0, alive: Callable[[], bool] = lambda: True) -> bool:
    """True once something accepts connections on 127.0.0.1:``port``; False as soon as
    ``alive()`` says the process meant to listen there has gone. TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while alive():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {port} after {timeout:g} s") from None
            time.sleep(0.05)
    return False


def unique_namespace() -> str:
    return "t" + secrets.token_hex(5)


@dataclass
class ManagedProcess:
    name: str
    cmd: list[str]
    env: dict[str, str]
    ready_url: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default_factory=lambda: LOG_DIR / "unset.log")
    stopped: bool = False  # the harness (kill/stop) ended it: any other exit is a crash
    decision_log: Path | None = None  # a gateway's or router's decision log (Stack.gateway, Stack.router)

    def crashed(self) -> bool:
        """Exited while nobody asked it to (fails the running test: see ``fixtures.stack``)."""
        return self.proc is not None and not self.stopped and self.proc.poll() is not None

    def start(self) -> ManagedProcess:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"{self.name}-{secrets.token_hex(3)}.log"
        out = self.log_path.open("wb")
        full_env = {**os.environ, **self.env}
        # Own process group: stopping it also stops children (vLLM runs its engine core in one).
        self.proc = subprocess.Popen(
            self.cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def wait_ready(self, timeout: float = 30.0) -> ManagedProcess:
        assert self.proc is not None and self.ready_url is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.ready_url, timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready at {self.ready_url} after {timeout}s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        self.stopped = True
        if self.alive():
            assert self.proc is not None
            self._signal_group(signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP the process group: it holds its sockets open and answers nothing (a hung process)."""
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_group(signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> ManagedProcess:
        """A new process of the same command and environment (same port, same id), after this one
        ended (a crash restarted by its supervisor); waits until ready when there is a ready URL."""
        if self.alive():
            self.stop()
        self.stopped = False
        self.start()
        if self.ready_url is not None:
            self.wait_ready(timeout)
        return self

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0fs; killing", self.name, timeout)
                self.proc.kill()
                self.proc.wait(10)
        # Whatever the process left behind in its group (engine subprocesses) goes too.
        self._signal_group(signal.SIGKILL)
        return self.proc.returncode


_ROLE_OF_MODULE = {
    "llmlab_gateway": "gateway",
    "llmlab_budget": "budget",
    "llmlab_router": "router",
    "llmlab_accounting": "accounting",
}
# Where the gateway and workers take their id (a process user is named after it).
_ID_ENV = {"gateway": "LLMLAB_GATEWAY_GATEWAY_ID", "worker": "LLMLAB_WORKER_WORKER_ID"}


@dataclass
class Stack:
    """Processes of one test, all in one NATS namespace; ``close()`` stops them."""

    namespace: str
    nats_url: str = os.environ.get("LLMLAB_NATS_URL", "nats://127.0.0.1:4222")
    redis_url: str = os.environ.get("LLMLAB_REDIS_URL", "redis://127.0.0.1:6379/0")
    procs: list[ManagedProcess] = field(default_factory=list)
    python: str = sys.executable
    # Passwords of an authenticated NATS's users (llmlab_testkit.natsserver): each service then
    # connects as its role, or as its own process user <role>.<id> when there is one for its id
    # (llmlab_common.natsauth); None: unauthenticated, as the machine's NATS.
    nats_passwords: dict[str, str] | None = None
    _workdir: Path | None = None

    def base_env(self) -> dict[str, str]:
        return {
            "LLMLAB_NAMESPACE": self.namespace,
            "LLMLAB_NATS_URL": self.nats_url,
            "LLMLAB_REDIS_URL": self.redis_url,
            "LLMLAB_ENV": "test",
            "LLMLAB_LOG_JSON": "true",
        }

    def _launch(
        self,
        name: str,
        module: str,
        env: dict[str, str],
        args: list[str],
        port: int,
        ready_path: str,
        wait: bool,
        timeout: float = 30.0,
        python: str | None = None,
    ) -> ManagedProcess:
        role = _ROLE_OF_MODULE.get(module, "worker" if module.startswith("llmlab_worker") else "")
        if self.nats_passwords is not None and role:
            # A process's own user (<role>.<id>) when the server has one for this id, else the role's.
            ident = env.get(_ID_ENV.get(role, ""), "")
            user = f"{role}.{ident}" if f"{role}.{ident}" in self.nats_passwords else role
            env = {"LLMLAB_NATS_USER": user, "LLMLAB_NATS_PASSWORD": self.nats_passwords[user], **env}
        p = ManagedProcess(
            name,
            [python or self.python, "-m", module, *args],
            {**self.base_env(), **env},
            ready_url=f"http://127.0.0.1:{port}{ready_path}",
        )
        self.procs.append(p.start())
        if wait:
            p.wait_ready(timeout)
        p.port = port  # type: ignore[attr-defined]
        return p

    def sim(
        self,
        flavor: str = "vllm",
        model: str = "meta-llama/Llama-3.1-8B-Instruct",
        *,
        ttft_ms: float = 50,
        itl_ms: float = 10,
        max_num_seqs: int = 256,
        output_len: int = 32,
        wait: bool = True,
        extra: list[str] | None = None,
    ) -> ManagedProcess:
        port = free_port()
        args = [
            "--flavor",
            flavor,
            "--port",
            str(port),
            "--model",
            model,
            "--ttft-ms",
            str(ttft_ms),
            "--itl-ms",
            str(itl_ms),
            "--max-num-seqs",
            str(max_num_seqs),
            "--output-len",
            str(output_len),
            *(extra or []),
        ]
        return self._launch(f"sim-{flavor}", "llmlab_engine_sim", {}, args, port, "/health", wait)

    def worker(
        self,
        engine: str,
        pool: str,
        engine_url: str,
        *,
        max_concurrency: int = 16,
        heartbeat_s: float = 0.2,
        worker_id: str | None = None,
        wait: bool = True,
        env: dict[str, str] | None = None,
        python: str | None = None,
        ready_timeout: float = 30.0,
    ) -> ManagedProcess:
        """``python``: another interpreter (worker-vllm's in-process mode runs in vLLM's venv)."""
        port = free_port()
        wenv = {
            "LLMLAB_WORKER_PORT": str(port),
            "LLMLAB_WORKER_POOL": pool,
            "LLMLAB_WORKER_ENGINE_URL": engine_url,
            "LLMLAB_WORKER_MAX_CONCURRENCY": str(max_concurrency),
            "LLMLAB_WORKER_HEARTBEAT_INTERVAL_S": str(heartbeat_s),
            "LLMLAB_WORKER_DRAIN_TIMEOUT_S": "5",
            "LLMLAB_WORKER_PULL_EXPIRES_S": "0.5",
            **({"LLMLAB_WORKER_WORKER_ID": worker_id} if worker_id else {}),
            **(env or {}),
        }
        return self._launch(
            f"worker-{engine}-{pool}",
            f"llmlab_worker_{engine}",
            wenv,
            [],
            port,
            "/ready",
            wait,
            timeout=ready_timeout,
            python=python,
        )

    @property
    def workdir(self) -> Path:
        """A directory of this stack's own (decision logs, catalogs), removed by :meth:`close`."""
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix=f"llmlab-{self.namespace}-"))
        return self._workdir

    def gateway(
        self,
        *,
        queue_timeout_s: float | None = None,
        auth: str = "static",
        router: str = "embedded",
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> ManagedProcess:
        """A gateway; ``auth="static"`` (the dev key, no budgets) unless a test runs the budget;
        ``router="embedded"`` (decides in-process) unless a test runs the router service."""
        port = free_port()
        genv = {
            "LLMLAB_GATEWAY_PORT": str(port),
            "LLMLAB_GATEWAY_AUTH": auth,
            "LLMLAB_GATEWAY_ROUTER": router,
            "LLMLAB_GATEWAY_DECISION_LOG": str(self.workdir / f"gateway-{port}-decisions.jsonl"),
            "LLMLAB_GATEWAY_WORKER_DISCOVERY_GRACE_S": "0.6",
            "LLMLAB_GATEWAY_DRAIN_TIMEOUT_S": "5",
            **({"LLMLAB_GATEWAY_QUEUE_TIMEOUT_S": str(queue_timeout_s)} if queue_timeout_s else {}),
            **(env or {}),
        }
        p = self._launch("gateway", "llmlab_gateway", genv, [], port, "/ready", wait)
        p.decision_log = Path(genv["LLMLAB_GATEWAY_DECISION_LOG"])
        return p

    def budget(self, *, env: dict[str, str] | None = None, wait: bool = True) -> ManagedProcess:
        """A budget service process (Redis keys under ``<namespace>:bud``; the fixture deletes them)."""
        port = free_port()
        benv = {"LLMLAB_BUDGET_PORT": str(port), "LLMLAB_BUDGET_DRAIN_TIMEOUT_S": "5", **(env or {})}
        return self._launch("budget", "llmlab_budget", benv, [], port, "/ready", wait)

    def router(self, *, env: dict[str, str] | None = None, wait: bool = True) -> ManagedProcess:
        """A router service process; its decision log is ``<workdir>/router-<port>.jsonl``."""
        port = free_port()
        renv = {
            "LLMLAB_ROUTER_PORT": str(port),
            "LLMLAB_ROUTER_DRAIN_TIMEOUT_S": "5",
            "LLMLAB_ROUTER_DISCOVERY_GRACE_S": "0.6",
            "LLMLAB_ROUTER_DECISION_LOG": str(self.workdir / f"router-{port}.jsonl"),
            **(env or {}),
        }
        p = self._launch("router", "llmlab_router", renv, [], port, "/ready", wait)
        p.decision_log = Path(renv["LLMLAB_ROUTER_DECISION_LOG"])
        return p

    def close(self) -> None:
        """Stop the processes, then delete the namespace's JetStream streams and Redis keys:
        every user of a Stack (tests, benchmarks, demos) leaves nothing behind on the shared
        NATS and Redis (a server full of leaked streams refuses new ones)."""
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self.delete_namespace()

    def delete_namespace(self, timeout: float = 15.0) -> None:
        """:func:`drop_namespace` for this stack (as NATS's admin user where the server authenticates)."""
        user = password = ""
        if self.nats_passwords is not None:
            if "admin" not in self.nats_passwords:
                log.warning("namespace %s left: no admin user to delete its streams", self.namespace)
                return
            user, password = "admin", self.nats_passwords["admin"]
        drop_namespace(self.namespace, self.nats_url, self.redis_url, user, password, timeout)

    def accounting(
        self, *, data_dir: Path | None = None, env: dict[str, str] | None = None, wait: bool = True
    ) -> ManagedProcess:
        """An accounting service process on an embedded chdb directory (``<workdir>/accounting``
        unless given: a restart of the same stack reopens the same data)."""
        port = free_port()
        aenv = {
            "LLMLAB_ACCOUNTING_PORT": str(port),
            "LLMLAB_ACCOUNTING_DATA_DIR": str(data_dir or self.workdir / "accounting"),
            "LLMLAB_ACCOUNTING_DRAIN_TIMEOUT_S": "5",
            **(env or {}),
        }
        return self._launch("accounting", "llmlab_accounting", aenv, [], port, "/ready", wait, timeout=60)


async def delete_namespace(namespace: str, nats_url: str, redis_url: str, user: str = "", password: str = "") -> None:
    """Delete a namespace's JetStream streams and every Redis key under ``<namespace>:``."""
    nc = await connect(nats_url, "test-cleanup", user=user, password=password)
    try:
        await delete_streams(nc.jetstream(), Topology(namespace))
    finally:
        await nc.close()
    redis = Redis.from_url(redis_url)
    try:  # every Redis key of a namespace starts with it (budget: "<ns>:bud:...")
        keys = [k async for k in redis.scan_iter(match=f"{namespace}:*", count=1000)]
        for i in range(0, len(keys), 1000):
            await redis.delete(*keys[i : i + 1000])
    finally:
        await redis.aclose()


def drop_namespace(
    namespace: str, nats_url: str, redis_url: str, user: str = "", password: str = "", timeout: float = 15.0
) -> None:
    """:func:`delete_namespace` from sync code, in a thread of its own so that a caller inside an event
    loop may call it too; a failure is logged, not raised (cleanup must not hide the error a test or
    bench is reporting)."""
    errors: list[BaseException] = []

    def _run() -> None:
        try:
            asyncio.run(asyncio.wait_for(delete_namespace(namespace, nats_url, redis_url, user, password), timeout))
        except Exception as exc:  # reported below, never raised
            errors.append(exc)

    t = threading.Thread(target=_run, name=f"cleanup-{namespace}", daemon=True)
    t.start()
    t.join(timeout + 5)
    if errors or t.is_alive():
        log.warning("namespace %s not fully deleted: %s", namespace, errors or "timed out")


def url(p: ManagedProcess) -> str:
    return f"http://127.0.0.1:{p.port}"  # type: ignore[attr-defined]
