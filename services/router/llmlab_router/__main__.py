"""``python -m llmlab_router``: run the router service (settings from ``LLMLAB_ROUTER_*``).

``python -m llmlab_router explain <request_id> [--log FILE]``: recompute a logged decision from
its record alone and show why it was made (exit 1 if the recomputation differs or it is missing).
``python -m llmlab_router check [--catalog FILE]``: validate a catalog's routing config (exit 1 on errors).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llmlab_common.catalog import CatalogError
from llmlab_common.runtime import run_service
from llmlab_routing.config import load_router_catalog
from llmlab_routing.records import explain_text, find_record, replay

from llmlab_router.app import create_app
from llmlab_router.settings import RouterSettings


def _tune(settings: RouterSettings) -> None:
    # The decision log's writer thread shares the GIL with the decisions: a short switch
    # interval bounds how long a decision waits for it (CPython's default is 5 ms).
    sys.setswitchinterval(settings.gil_switch_interval_s)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("explain", "check"):
        run_service(
            "router",
            RouterSettings,
            create_app,
            argv,
            description="Route decisions over NATS (also: explain <request_id>, check [--catalog FILE]).",
            prepare=_tune,
        )
        return 0
    settings = RouterSettings()
    ap = argparse.ArgumentParser(prog="python -m llmlab_router")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("explain", help="recompute a logged decision and show its reasons")
    ex.add_argument("request_id")
    ex.add_argument("--log", default=str(settings.decision_log), help="decision log (JSON lines)")
    ck = sub.add_parser("check", help="validate the catalog's routing config")
    ck.add_argument("--catalog", default=str(settings.infra.catalog_path))
    args = ap.parse_args(argv)
    if args.cmd == "check":
        try:
            rc = load_router_catalog(args.catalog)
        except CatalogError as exc:
            sys.stderr.write(f"{exc}\n")
            return 1
        sys.stdout.write(f"{args.catalog}: ok (version {rc.version}, policies {sorted(rc.routing.policies)})\n")
        return 0
    rec = find_record(args.log, args.request_id)
    if rec is None:
        sys.stderr.write(f"no decision for request {args.request_id!r} in {args.log}\n")
        return 1
    dec, same = replay(rec)
    sys.stdout.write(explain_text(rec, dec, same) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
