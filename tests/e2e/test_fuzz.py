"""Fuzzing the three HTTP APIs a client or an operator reaches, from their own OpenAPI documents
(schemathesis generates positive and negative cases per operation, hypothesis drives them):
the gateway's OpenAI routes, the budget admin API and the accounting query API, each served by a
live process of the stack. Every response must be below 500 and conform to the document: a
documented status, a body of the documented shape, a schema-valid request accepted and an
invalid one refused.

CI runs ``LLMLAB_FUZZ_EXAMPLES`` (14) schema-valid and as many invalid cases per operation;
``make fuzz`` runs more and writes the summary under ``results/fuzz/`` (``LLMLAB_FUZZ_OUT``).
The requests go out with httpx: the schemathesis transport (requests) breaks under
urllib3-future, which another package installs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import FlakyStrategyDefinition, Unsatisfiable
from llmlab_testkit.budget import DEV_ADMIN_KEY
from llmlab_testkit.e2e import LLAMA
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import Stack, url
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import ignored_auth, positive_data_acceptance

pytestmark = pytest.mark.e2e
EXAMPLES = int(os.environ.get("LLMLAB_FUZZ_EXAMPLES", "14"))
# Every case carries a valid key (so that it reaches the handlers); the "invalid auth accepted"
# check would read that as ignoring the generated one. Authentication is tested on its own (401
# for missing, wrong and revoked keys on each API: test_failure_modes, test_admin_api, test_report).
EXCLUDED = [ignored_auth]
# The accounting API takes SQL (and attribution windows bounded by their length): only ClickHouse
# can judge a statement, so a schema-valid body is not a promise of acceptance there. Its 5xx,
# documented statuses and response shapes are still checked.
SQL_EXCLUDED = [*EXCLUDED, positive_data_acceptance]
# The completion routes refuse, beyond their schema, a prompt plus max_tokens past the model's
# context (the catalog's) and JSON nested past 32 levels (stated on the routes): a schema-valid
# body may be refused there, so that check is off for them only.
SEMANTIC = {"POST /v1/chat/completions", "POST /v1/completions"}


def _fuzz(
    base: str, schema_path: str, key: str, excluded: list[Any] = EXCLUDED, model: str | None = None
) -> dict[str, Any]:
    """Run every operation of the document at ``base + schema_path``; returns per operation the
    cases sent, the statuses seen and the distinct problems found. ``model``: every other
    schema-valid body names this served model instead of a generated name (which would only
    reach the 404), so generated bodies reach admission, routing and a worker too."""
    schema = schemathesis.openapi.from_url(base + schema_path)
    client = httpx.Client(base_url=base, timeout=30)
    report: dict[str, Any] = {}
    for result in schema.get_all_operations():
        op = result.ok()
        seen: dict[str, Any] = {"cases": 0, "statuses": {}, "problems": []}
        report[op.label] = seen
        # Schema-valid cases and invalid ones, each its own budget of cases.
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            try:
                negative = mode == schemathesis.GenerationMode.NEGATIVE
                skip = [*excluded, positive_data_acceptance] if op.label in SEMANTIC else excluded
                _runner(op.as_strategy(generation_mode=mode), client, base, key, seen, skip, model, negative)()
            except Unsatisfiable:  # nothing can be invalid (GET /v1/models takes no input)
                seen.setdefault("no_negative_cases", True)
    client.close()
    return report


def _runner(
    strategy: Any,
    client: httpx.Client,
    base: str,
    key: str,
    seen: dict[str, Any],
    excluded: list[Any],
    model: str | None,
    negative: bool,
) -> Callable[[], None]:
    """One operation's hypothesis test: send each generated case, record status and problems
    (recorded, not raised: every operation runs its whole budget of cases)."""

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
        database=None,
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        if model and isinstance(case.body, dict) and isinstance(case.body.get("model"), str) and seen["cases"] % 2:
            case.body["model"] = model
        r = _send(client, case, base, key, negative)
        if r is None:
            seen["unsendable"] = seen.get("unsendable", 0) + 1
            return
        _check(case, schemathesis.Response.from_httpx(r, verify=True), seen, excluded)

    return run


def _send(client: httpx.Client, case: Any, base: str, key: str, negative: bool) -> httpx.Response | None:
    """Send one generated case (None: not sendable over HTTP at all)."""
    kw = case.as_transport_kwargs(base_url=base)
    headers = dict(kw.get("headers") or {})
    # An invalid case whose invalid part is a header (the Authorization one: missing or
    # malformed) is sent as generated, and the API must refuse it; every other case carries
    # a valid key, so that it reaches the handler.
    if not (negative and case.meta is not None and case.meta.is_negative_at(ParameterLocation.HEADER)):
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        headers["Authorization"] = f"Bearer {key}"
    body = kw.get("data")
    try:
        return client.request(
            kw["method"],
            kw["url"],
            headers=headers,
            params=kw.get("params"),
            content=body if isinstance(body, bytes | str) else None,
            json=kw.get("json"),
        )
    except (httpx.LocalProtocolError, httpx.InvalidURL, UnicodeEncodeError):
        return None  # a header value "Bearer ": no server can receive it


def _check(case: Any, r: schemathesis.Response, seen: dict[str, Any], excluded: list[Any]) -> None:
    """Record the status and the problems the document's checks find (recorded, not raised:
    every operation runs its whole budget of cases)."""
    seen["cases"] += 1
    seen["statuses"][str(r.status_code)] = seen["statuses"].get(str(r.status_code), 0) + 1
    try:
        case.validate_response(r, excluded_checks=excluded)
        if r.status_code >= 500:
            raise AssertionError(f"{r.status_code}: {r.content[:300]!r}")
    except (Exception, BaseExceptionGroup) as exc:  # schemathesis' failure group, or the 5xx above
        problem = f"{r.status_code} {type(exc).__name__}: {str(exc)[:600]}"
        if len(seen["problems"]) < 5 and problem not in seen["problems"]:
            seen["problems"].append(problem)


def _fuzz_stateful(base: str, schema_path: str, key: str, excluded: list[Any] = EXCLUDED) -> dict[str, Any]:
    """Chains of calls in which later operations take the ids earlier responses returned
    (schemathesis infers the links from the response schemas and path parameters): a tenant
    created, then its teams, users, keys and admin keys read, changed, rotated and revoked,
    where one-off cases mostly reach a 404 for a random id. Same checks as :func:`_fuzz`."""
    client = httpx.Client(base_url=base, timeout=30)
    report: dict[str, Any] = {}

    def seen_for(case: Any) -> dict[str, Any]:
        return report.setdefault(case.operation.label, {"cases": 0, "statuses": {}, "problems": []})

    schema = schemathesis.openapi.from_url(base + schema_path)
    # Schema-valid steps only: the one-off run covers invalid input, and a chain whose creation
    # was refused reaches nothing further.
    schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE])

    class Chains(schema.as_state_machine()):  # type: ignore[misc]
        unsent = False

        def call(self, case: Any, **kwargs: Any) -> Any:
            r = _send(client, case, base, key, negative=False)
            self.unsent = r is None
            if r is None:  # not sendable: a stand-in response the checks below skip
                seen_for(case)["unsendable"] = seen_for(case).get("unsendable", 0) + 1
                r = client.get("/health")
            return schemathesis.Response.from_httpx(r, verify=True)

        def validate_response(self, response: Any, case: Any, *args: Any, **kwargs: Any) -> None:
            if not self.unsent:
                _check(case, response, seen_for(case), excluded)

    chain_settings = settings(
        max_examples=EXAMPLES * 2,  # chains of up to 30 calls
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],  # no replay or shrinking against a server whose state moved on
        database=None,
    )
    # The server's state carries over from chain to chain (a name taken, a key revoked), so a
    # chain hypothesis draws again may see other answers than the first time; hypothesis stops
    # the run then (FlakyStrategyDefinition). What ran until then is kept; another run goes on.
    for _ in range(3):
        try:
            Chains.run(settings=chain_settings)
            break
        except FlakyStrategyDefinition:
            stops = report.setdefault(
                "(chains stopped by changed server state)", {"cases": 0, "statuses": {}, "problems": []}
            )
            stops["cases"] += 1
    client.close()
    return report


def test_the_apis_hold_to_their_documents_under_generated_input(stack: Stack) -> None:
    """Catches: a 500 on input someone can send, an OpenAPI document that does not say what a
    route accepts or answers (dd4f538: 43 gateway cases, most refused as schema mismatches), a
    schema-valid body refused or an invalid one accepted."""
    sim = stack.sim("vllm", LLAMA, ttft_ms=2, itl_ms=1, output_len=4)
    stack.worker("vllm", "gpu-vllm", url(sim))
    gw = stack.gateway()
    budget = stack.budget()
    acc = stack.accounting()
    t0, started = time.monotonic(), dt.datetime.now(dt.UTC)
    reports = {
        "gateway": _fuzz(url(gw), "/openapi.json", DEV_KEY, model=LLAMA),
        "budget admin": _fuzz(url(budget), "/openapi.json", DEV_ADMIN_KEY),
        "budget admin, chained calls": _fuzz_stateful(url(budget), "/openapi.json", DEV_ADMIN_KEY),
        "accounting": _fuzz(url(acc), "/openapi.json", DEV_ADMIN_KEY, SQL_EXCLUDED),
    }
    summary = {
        "examples_per_operation": EXAMPLES,
        "seconds": round(time.monotonic() - t0, 1),
        "apis": {
            api: {
                "operations": len(ops),
                "cases": sum(o["cases"] for o in ops.values()),
                "statuses": {k: sum(o["statuses"].get(k, 0) for o in ops.values()) for k in _statuses(ops)},
                "problems": {label: o["problems"] for label, o in ops.items() if o["problems"]},
            }
            for api, ops in reports.items()
        },
    }
    # What the chains reached: operations on an id that answered 2xx, which one-off cases (a
    # random id) almost never do.
    reached = sorted(
        label
        for label, o in reports["budget admin, chained calls"].items()
        if "{" in label and any(k.startswith("2") for k in o["statuses"])
    )
    summary["apis"]["budget admin, chained calls"]["reached_with_real_ids"] = reached
    out = os.environ.get("LLMLAB_FUZZ_OUT")
    if out:
        from llmlab_loadtest.bench_meta import git, write_outputs

        summary["git_commit"] = git("rev-parse", "HEAD") or "unknown"
        summary["git_dirty"] = bool(git("status", "--porcelain").strip())
        summary["command_line"] = f"LLMLAB_FUZZ_EXAMPLES={EXAMPLES} make fuzz"
        write_outputs(summary, Path(out), started, "fuzz", _markdown, _plot)
    print(json.dumps(summary, indent=2))
    for api, s in summary["apis"].items():
        assert s["operations"] > 0 and s["cases"] > 0, api
        assert not s["problems"], f"{api}: {json.dumps(s['problems'], indent=2)}"
    assert len(reached) >= 10, reached  # of 20 operations on an id (18 in a typical CI-sized run)


def _statuses(ops: dict[str, Any]) -> list[str]:
    return sorted({k for o in ops.values() for k in o["statuses"]})


def _markdown(summary: dict[str, Any]) -> str:
    lines = [
        "# Fuzzing the APIs from their OpenAPI documents",
        "",
        f"schemathesis, {summary['examples_per_operation']} generated cases per operation (positive and negative),"
        f" {summary['seconds']} s, commit {summary.get('git_commit', '?')[:12]}. Checks: no 5xx, documented"
        " status and response shape, invalid refused, schema-valid accepted (not where the API judges more than"
        " a schema can say: the accounting SQL, the completions' context length).",
        "",
        "| API | operations | cases | statuses | problems |",
        "|---|---|---|---|---|",
    ]
    for api, a in summary["apis"].items():
        statuses = ", ".join(f"{k}: {v}" for k, v in a["statuses"].items())
        lines.append(
            f"| {api} | {a['operations']} | {a['cases']} | {statuses} | {sum(map(len, a['problems'].values()))} |"
        )
    return "\n".join(lines) + "\n"


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apis = list(summary["apis"])
    statuses = sorted({k for a in summary["apis"].values() for k in a["statuses"]})
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0] * len(apis)
    for status in statuses:
        counts = [summary["apis"][a]["statuses"].get(status, 0) for a in apis]
        ax.bar(apis, counts, bottom=bottom, label=status)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_ylabel("generated cases")
    ax.set_title("Responses to generated cases, by HTTP status")
    ax.legend(title="status", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
