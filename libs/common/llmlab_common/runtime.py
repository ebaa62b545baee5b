"""Service runtime: /health, /ready, /metrics, JSON logs, and drain on SIGTERM.

Every service is a FastAPI app made by ``create_app(settings)`` whose lifespan opens its
resources; :func:`serve` runs it under uvicorn. On SIGTERM/SIGINT the service first reports
not-ready (so no new traffic arrives), then uvicorn stops accepting, waits for open requests
up to ``drain_timeout_s``, and the lifespan's shutdown drains background work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TypeVar

import uvicorn
from fastapi import APIRouter, FastAPI, Response

from llmlab_common.logging import setup_logging
from llmlab_common.metrics import Metrics
from llmlab_common.settings import InfraSettings, ScalableSettings, ServiceSettings

log = logging.getLogger(__name__)
SettingsT = TypeVar("SettingsT", bound=ServiceSettings)


@dataclass
class ServiceState:
    """Readiness as the sum of named checks; draining overrides everything."""

    draining: bool = False
    checks: dict[str, Callable[[], bool]] = field(default_factory=dict)

    def ready(self) -> tuple[bool, dict[str, bool]]:
        results = {name: bool(check()) for name, check in self.checks.items()}
        return (not self.draining and all(results.values())), results


def ops_router(state: ServiceState, metrics: Metrics) -> APIRouter:
    router = APIRouter()

    @router.get("/health", include_in_schema=False)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/ready", include_in_schema=False)
    async def ready() -> Response:
        ok, results = state.ready()
        body = json.dumps({"ready": ok, "draining": state.draining, "checks": results})
        return Response(body, status_code=200 if ok else 503, media_type="application/json")

    @router.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    return router


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel a background task and wait until it has stopped (for an AsyncExitStack)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServiceState, copies: Copies | None = None) -> None:
        super().__init__(config)
        self._state = state
        self._copies = copies

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self._copies is not None:
            # Here, not after run(): uvicorn re-raises the SIGTERM it caught once run() returns,
            # which ends this process before any later code; the copies must be gone first.
            await asyncio.to_thread(self._copies.stop)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self._state.draining:
            log.info("signal %s: draining (not ready, finishing in-flight work)", sig)
            if self._copies is not None:
                self._copies.signal_drain()  # the copies drain at the same time
        self._state.draining = True
        super().handle_exit(sig, frame)


def _listen(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class Copies:
    """The other processes of a service run with ``processes > 1``: copies of this one (same
    module, same environment) that each bind the port with SO_REUSEPORT. They die with this
    process (PR_SET_PDEATHSIG) and are told to drain when it is."""

    def __init__(self, settings: ScalableSettings, module: str) -> None:
        self.settings = settings
        self.module = module
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        s = self.settings
        prefix = str(s.model_config.get("env_prefix", ""))
        for i in range(1, s.processes):
            env = {**os.environ, f"{prefix}PROCESSES": "1", f"{prefix}REUSE_PORT": "true", f"{prefix}PORT": str(s.port)}
            env[f"{prefix}PROCESS_INDEX"] = str(i)
            if s.instance_id_field and f"{prefix}{s.instance_id_field}".upper() in {k.upper() for k in os.environ}:
                # An id set for the service names its first process; each copy gets its own.
                env[f"{prefix}{s.instance_id_field}".upper()] = f"{getattr(s, s.instance_id_field)}-p{i}"
            self.procs.append(
                subprocess.Popen([sys.executable, "-m", self.module], env=env, preexec_fn=_die_with_parent)
            )
        log.info("started %d more %s process(es) on port %d", len(self.procs), self.module, s.port)

    def signal_drain(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        self.signal_drain()
        for p in self.procs:
            try:
                p.wait(self.settings.drain_timeout_s + 5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG = 1: a copy gets SIGTERM when its parent dies, even by SIGKILL.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def serve(app: FastAPI, settings: ServiceSettings, service: str, copies: Copies | None = None) -> None:
    """Run a service app until SIGTERM/SIGINT; the app must expose ``app.state.service_state``.
    A scalable service with ``processes > 1`` (or ``reuse_port``) binds its port with
    SO_REUSEPORT, and ``copies`` are drained and stopped with it."""
    setup_logging(service, settings.infra.log_level, settings.infra.log_json)
    state: ServiceState = app.state.service_state
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
        timeout_keep_alive=30,
        backlog=4096,
    )
    server = _DrainingServer(config, state, copies)
    sockets: list[socket.socket] | None = None
    if isinstance(settings, ScalableSettings) and (settings.reuse_port or settings.processes > 1):
        sockets = [_listen(settings.host, settings.port, reuse_port=True)]
        if settings.process_ops_port_base:
            port = settings.process_ops_port_base + settings.process_index
            sockets.append(_listen(settings.host, port, reuse_port=False))
    try:
        if copies is not None:
            copies.start()
        # Server.run() uses uvicorn's loop setting ("auto": uvloop when installed). Its transports
        # and timers cost about half of asyncio's at 1,000 streams.
        server.run(sockets=sockets)
    finally:
        if copies is not None:
            copies.stop()


def settings_help(settings_cls: type[ServiceSettings]) -> str:
    """Every environment variable a service reads, with its default (for ``--help``)."""
    prefix = settings_cls.model_config.get("env_prefix", "")
    lines = ["settings (environment variables):"]
    for cls, pre in ((settings_cls, prefix), (InfraSettings, InfraSettings.model_config.get("env_prefix", ""))):
        for name, info in cls.model_fields.items():
            if name == "infra":
                continue
            value = info.default
            default = "(generated)" if info.default_factory is not None else repr(value)
            if isinstance(value, Path):
                default = str(value)
            lines.append(f"  {(pre + name).upper():<44} {default}")
    return "\n".join(lines)


def freeze_startup_objects(infra: InfraSettings) -> int:
    """``gc.freeze()`` unless ``LLMLAB_GC_FREEZE=false``: the objects alive after start-up go to
    the permanent generation, which no collection walks again; ``LLMLAB_GC_YOUNG_THRESHOLD``
    sets the young generation's threshold. Returns how many objects are frozen."""
    if infra.gc_young_threshold:
        gc.set_threshold(infra.gc_young_threshold, *gc.get_threshold()[1:])
    if infra.gc_freeze:
        gc.collect()  # what start-up left as garbage is freed, not frozen
        gc.freeze()
    return gc.get_freeze_count()


def run_service(
    service: str,
    settings_cls: type[SettingsT],
    app_factory: Callable[[SettingsT], FastAPI],
    argv: Sequence[str] | None = None,
    description: str = "",
    prepare: Callable[[SettingsT], None] | None = None,
) -> None:
    """``python -m <service>``: ``--help`` lists the settings; otherwise read them from the
    environment, build the app (``prepare`` may then tune the process) and serve until SIGTERM."""
    parser = argparse.ArgumentParser(
        prog=f"python -m llmlab_{service.replace('-', '_')}",
        description=description,
        epilog=settings_help(settings_cls),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    settings = settings_cls()
    app = app_factory(settings)
    if prepare is not None:
        prepare(settings)
    freeze_startup_objects(settings.infra)
    copies = None
    if isinstance(settings, ScalableSettings) and settings.processes > 1:
        copies = Copies(settings, f"llmlab_{service.replace('-', '_')}")
    serve(app, settings, service, copies)
