"""NATS as a trust boundary: one user per role, each allowed only the subjects its role uses.

The one place the permissions are written: :func:`permissions` derives them from the subject
contract (:class:`~llmlab_common.subjects.Topology`), and :func:`server_config` renders a
nats-server configuration with them (``python -m llmlab_common.natsauth`` writes one).

What the roles may do, and the forgeries that are refused because of it:

- only ``budget`` receives ``budget.reserve`` (and ``budget.reserve_batch``) and answers it
  (replies go only to the asker's inbox, ``allow_responses``): nobody else can answer a reserve with a forged principal;
- only ``worker`` publishes tokens and heartbeats: nobody injects text into a stream or
  forges a worker; a worker is refused any other subject, so a request whose ``reply_subject``
  names ``budget.reserve`` or an event subject cannot turn a worker into a forger either;
- only ``gateway`` publishes requests, cancels and request events; attempt events come from
  workers and gateways (a gateway reports the attempts it gave up on);
- only ``budget`` and ``accounting`` read the events stream through their durable consumers;
- stream updates, deletes and purges, and consumer deletes on the durable consumers, are
  ``admin``'s alone.

Each role's replies come to its own inbox prefix (``_INBOX_<role>``, set by
:func:`llmlab_common.natsio.connect`), so a role cannot read another role's replies.

**Users per process.** A role user is shared by every process of the role, so one gateway could
read another's tokens and one worker could heartbeat as another. A user named ``<role>.<id>``
(``gateway.gw-a``, ``worker.vllm-1``) is one process's: its permissions are its role's, narrowed
to its own id: a gateway subscribes only to its own tokens (``<ns>.tok.<id>.>``) and alive
probes, a worker publishes heartbeats only under its own id, and each reads only its own inbox
(``_INBOX_<role>.<id>``). The gateway and workers refuse to start when their id is not the one
their user names (:class:`llmlab_common.settings.ScalableSettings`).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmlab_common.subjects import Topology, check_token

ROLES = ("gateway", "worker", "budget", "router", "accounting", "admin")
JS = "$JS.API"


def inbox_prefix(user: str) -> str:
    """Where a user's request replies and pulled messages arrive: ``_INBOX_<role>`` for a role
    user, ``_INBOX_<role>.<id>`` for a process's user (inside its role's, which the role user reads)."""
    return f"_INBOX_{user}"


def split_user(user: str) -> tuple[str, str | None]:
    """A NATS user's role and, for a process's own user (``<role>.<id>``), its id."""
    role, _, ident = user.partition(".")
    return role, ident or None


def _js_common(topo: Topology) -> list[str]:
    """JetStream API calls every service makes at start (llmlab_common.natsio.ensure_streams:
    read the streams and create a missing one from the code's config; updates are admin's)."""
    out = [f"{JS}.INFO"]
    for stream in (topo.requests_stream, topo.events_stream, topo.dead_letter_stream):
        out += [f"{JS}.STREAM.INFO.{stream}", f"{JS}.STREAM.CREATE.{stream}"]
    # ...and the events stream's two durable consumers when missing (interest retention keeps
    # nothing for a consumer that does not exist, so whoever publishes first makes them).
    for durable in (topo.BUDGET_SETTLE_CONSUMER, topo.ACCOUNTING_CONSUMER):
        out += [
            f"{JS}.CONSUMER.INFO.{topo.events_stream}.{durable}",
            f"{JS}.CONSUMER.CREATE.{topo.events_stream}.{durable}",
            f"{JS}.CONSUMER.CREATE.{topo.events_stream}.{durable}.>",
            f"{JS}.CONSUMER.DURABLE.CREATE.{topo.events_stream}.{durable}",
        ]
    return out


def _consumer(stream: str, durable: str) -> list[str]:
    """A durable pull consumer: create it, read its state, pull from it, ack its messages."""
    return [
        f"{JS}.CONSUMER.CREATE.{stream}.{durable}",
        f"{JS}.CONSUMER.CREATE.{stream}.{durable}.>",
        f"{JS}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{JS}.CONSUMER.INFO.{stream}.{durable}",
        f"{JS}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _ordered_events(topo: Topology) -> list[str]:
    """An ordered (ephemeral, push) consumer on the events stream: the live feed of attempt events
    the routing state learns from (llmlab_routing.feed)."""
    s = topo.events_stream
    return [f"{JS}.CONSUMER.CREATE.{s}", f"{JS}.CONSUMER.CREATE.{s}.>", f"{JS}.CONSUMER.DELETE.{s}.*", f"$JS.FC.{s}.>"]


def permissions(topo: Topology) -> dict[str, dict[str, Any]]:
    """Publish and subscribe allow-lists of every role, as nats-server's ``permissions`` blocks."""
    ns = topo.namespace
    req, evt = topo.requests_stream, topo.events_stream
    perms: dict[str, dict[str, Any]] = {
        "gateway": {
            "publish": [
                f"{ns}.req.>",  # attempts (JetStream: the stream answers the publish)
                topo.attempt_event_subject,
                topo.request_event_subject,
                topo.cancel_subject,
                topo.budget_reserve_subject,
                topo.budget_reserve_batch_subject,
                topo.router_route_subject,
                topo.router_route_batch_subject,
                topo.router_commit_wildcard,  # shared router mode: its own decisions, narrowed to its id
                *_js_common(topo),
                *_ordered_events(topo),
            ],
            "subscribe": [f"{ns}.tok.>", f"{ns}.ctl.alive.>", topo.heartbeat_wildcard, topo.router_commit_wildcard],
            "allow_responses": True,  # answers the workers' "still wanted?" probes
        },
        "worker": {
            "publish": [
                f"{ns}.tok.>",
                topo.attempt_event_subject,
                topo.dead_letter_subject,
                f"{ns}.hb.>",
                f"{ns}.ctl.alive.>",  # the probe (a request to the gateway)
                *_js_common(topo),
                # The pool consumer and the per-worker consumers, whatever their names.
                f"{JS}.CONSUMER.CREATE.{req}.>",
                f"{JS}.CONSUMER.DURABLE.CREATE.{req}.>",
                f"{JS}.CONSUMER.INFO.{req}.>",
                f"{JS}.CONSUMER.MSG.NEXT.{req}.>",
                f"$JS.ACK.{req}.>",
            ],
            "subscribe": [topo.cancel_subject],
        },
        "budget": {
            "publish": [topo.dead_letter_subject, *_js_common(topo), *_consumer(evt, topo.BUDGET_SETTLE_CONSUMER)],
            "subscribe": [topo.budget_reserve_subject, topo.budget_reserve_batch_subject],
            "allow_responses": True,
        },
        "router": {
            "publish": [
                *_js_common(topo),
                *_ordered_events(topo),
                f"{JS}.CONSUMER.LIST.{req}",  # the queue depth per pool
                f"{JS}.CONSUMER.INFO.{req}.>",
            ],
            "subscribe": [
                topo.router_route_subject,
                topo.router_route_batch_subject,
                topo.heartbeat_wildcard,
                topo.router_commit_wildcard,
            ],
            "allow_responses": True,
        },
        "accounting": {
            "publish": [
                topo.dead_letter_subject,
                *_js_common(topo),
                *_consumer(evt, topo.ACCOUNTING_CONSUMER),
                f"{JS}.STREAM.MSG.GET.{evt}",  # recovery reads what a dead predecessor fetched
                f"{JS}.CONSUMER.LIST.{evt}",  # the consumers' backlog gauges
            ],
            "subscribe": [topo.heartbeat_wildcard],
        },
        "admin": {"publish": [">"], "subscribe": [">"]},
    }
    for role, p in perms.items():
        p["subscribe"] = [*p["subscribe"], f"{inbox_prefix(role)}.>"]
    return perms


def permissions_for(topo: Topology, user: str) -> dict[str, Any]:
    """The permissions of one user: its role's, narrowed to its id for a process's own user."""
    role, ident = split_user(user)
    if role not in ROLES:
        raise ValueError(f"unknown NATS role {role!r} in user {user!r} (roles: {', '.join(ROLES)})")
    perm = permissions(topo)[role]
    if ident is None:
        return perm
    check_token(ident, "process id")
    ns = topo.namespace
    narrowed = {  # a gateway reads only its own tokens and alive probes; everyone only its own inbox
        f"{ns}.tok.>": f"{ns}.tok.{ident}.>",
        f"{ns}.ctl.alive.>": topo.alive_subject(ident),
        f"{inbox_prefix(role)}.>": f"{inbox_prefix(user)}.>",
    }
    out = dict(perm)
    out["subscribe"] = [narrowed.get(s, s) for s in perm["subscribe"]]
    if role == "worker":  # a worker publishes tokens to every gateway, heartbeats only as itself
        out["publish"] = [f"{ns}.hb.*.{ident}" if s == f"{ns}.hb.>" else s for s in perm["publish"]]
    if role == "gateway":  # a gateway's routing decisions go out under its own id only
        own = topo.router_commit_subject(ident)
        out["publish"] = [own if s == topo.router_commit_wildcard else s for s in perm["publish"]]
    return out


# The gateway forwards request bodies of up to 4 MiB as one message (GatewaySettings.max_body_bytes);
# nats-server's default max_payload is 1 MiB. As infra/nats/nats.conf.
MAX_PAYLOAD = 8 * 1024 * 1024


def server_config(
    topo: Topology,
    passwords: dict[str, str],
    *,
    port: int = 4222,
    store_dir: Path | None = None,
    host: str = "",
    max_payload: int = MAX_PAYLOAD,
) -> str:
    """A nats-server configuration: JetStream on, and one user per entry of ``passwords`` (a role,
    or a process's ``<role>.<id>``) with its permissions and password (plain text here: keep the
    file private, or replace each with a bcrypt hash from ``nats server passwd``, which
    nats-server accepts in the same place)."""
    users = []
    for role in passwords:
        perm = permissions_for(topo, role)
        block: dict[str, Any] = {
            "publish": {"allow": perm["publish"]},
            "subscribe": {"allow": perm["subscribe"]},
        }
        if perm.get("allow_responses"):
            block["allow_responses"] = True
        users.append({"user": role, "password": passwords[role], "permissions": block})
    js = {"store_dir": str(store_dir)} if store_dir is not None else {}
    lines = [f"port: {port}"]
    if host:
        lines.append(f"host: {json.dumps(host)}")
    lines.append(f"max_payload: {max_payload}")
    lines.append(f"jetstream: {json.dumps(js)}")
    # JSON is valid nats-server configuration syntax.
    lines.append("authorization: " + json.dumps({"users": users}, indent=2))
    return "\n".join(lines) + "\n"


def new_passwords(users: Sequence[str] = ROLES) -> dict[str, str]:
    return {user: secrets.token_urlsafe(24) for user in users}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write a nats-server configuration with one user per role or process.")
    ap.add_argument("--namespace", default="llmlab")
    ap.add_argument("--port", type=int, default=4222)
    ap.add_argument("--store-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, required=True, help="the server configuration to write")
    ap.add_argument("--passwords", type=Path, required=True, help="where each role's password is written (JSON)")
    ap.add_argument(
        "--user",
        action="append",
        dest="users",
        help="a role, or one process's user <role>.<id> (gateway.gw-a, worker.vllm-1); repeat it. "
        f"Default: the roles ({', '.join(ROLES)})",
    )
    args = ap.parse_args(argv)
    passwords = new_passwords(args.users or ROLES)
    for path, text in (
        (args.out, server_config(Topology(args.namespace), passwords, port=args.port, store_dir=args.store_dir)),
        (args.passwords, json.dumps(passwords, indent=2) + "\n"),
    ):
        path.write_text(text)
        path.chmod(0o600)
    sys.stdout.write(f"{args.out} and {args.passwords} written (mode 600)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
