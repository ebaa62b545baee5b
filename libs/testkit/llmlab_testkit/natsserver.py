"""A nats-server of the test's own, with JetStream and one user per role (the permissions of
:mod:`llmlab_common.natsauth`): what the trust-boundary tests run the stack against. The
machine's shared NATS on :4222 stays unauthenticated for the rest of the suite."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmlab_common.natsauth import ROLES, new_passwords, server_config
from llmlab_common.subjects import Topology

from llmlab_testkit.procs import free_port, wait_port


def nats_server_binary() -> str | None:
    return shutil.which("nats-server") or next(
        (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if Path(p).exists()), None
    )


@dataclass
class AuthNats:
    url: str
    passwords: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path

    def violations(self) -> list[str]:
        """The server's permission-violation log lines so far."""
        if not self.log.exists():
            return []
        return [line for line in self.log.read_text(errors="replace").splitlines() if "Violation" in line]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def start_auth_nats(workdir: Path, namespace: str, users: Sequence[str] = ROLES) -> AuthNats:
    """``users``: roles and processes' own users (``<role>.<id>``), one password each."""
    binary = nats_server_binary()
    if binary is None:
        raise RuntimeError("nats-server not found (the machine's NATS package provides it)")
    workdir.mkdir(parents=True, exist_ok=True)
    port, passwords = free_port(), new_passwords(users)
    conf = workdir / "nats.conf"
    conf.write_text(
        server_config(Topology(namespace), passwords, port=port, store_dir=workdir / "js", host="127.0.0.1")
    )
    conf.chmod(0o600)
    log = workdir / "nats.log"
    proc = subprocess.Popen(
        [binary, "-c", str(conf), "-l", str(log)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        up = wait_port(port, 15, lambda: proc.poll() is None)
    except TimeoutError:
        proc.kill()
        raise RuntimeError("nats-server did not start listening in 15 s") from None
    if not up:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        logged = log.read_text()[-2000:] if log.exists() else ""
        raise RuntimeError(f"nats-server exited ({proc.returncode}): {err[-2000:]} {logged}")
    return AuthNats(f"nats://127.0.0.1:{port}", passwords, proc, log)
