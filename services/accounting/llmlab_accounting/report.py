"""``python -m llmlab_accounting.report`` (``make report``): run every ``reports/sql/*.sql`` and
write ``reports/out/<name>.csv``, ``<name>.md``, a ``<name>.png`` plot where the file asks for one
(a ``-- plot: bar|line x=COL y=COL[,COL]`` line), and ``reports/out/README.md`` with every table.

The SQL goes to the running accounting service (``--url``, default http://127.0.0.1:8086 when it
answers), else to a ClickHouse server (``--dsn``), else to the chdb directory (``--data-dir``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import re
from pathlib import Path

from llmlab_accounting.ports import QueryResult
from llmlab_accounting.query import add_target_args, open_runner, service_up, to_markdown, write_csv

log = logging.getLogger(__name__)
DEFAULT_URL = "http://127.0.0.1:8086"
_PLOT = re.compile(r"^--\s*plot:\s*(bar|line)\s+x=(\w+)\s+y=([\w,]+)", re.M)


def plot(r: QueryResult, kind: str, x: str, ys: list[str], title: str, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not r.rows or x not in r.columns or any(y not in r.columns for y in ys):
        return False
    xi = r.columns.index(x)
    xs = [str(row[xi]) for row in r.rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    for n, y in enumerate(ys):
        yi = r.columns.index(y)
        vals = [float(row[yi] or 0) for row in r.rows]
        if kind == "line":
            ax.plot(xs, vals, marker="o", label=y)
        else:
            width = 0.8 / len(ys)
            ax.bar([i + n * width for i in range(len(xs))], vals, width=width, label=y)
    if kind == "bar":
        ax.set_xticks([i + 0.4 - 0.4 / len(ys) for i in range(len(xs))], xs, rotation=20, ha="right", fontsize=8)
    else:
        ax.tick_params(axis="x", rotation=30, labelsize=7)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per query otherwise
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(p)
    p.add_argument("--sql-dir", type=Path, default=Path("reports") / "sql")
    p.add_argument("--out", type=Path, default=Path("reports") / "out")
    args = p.parse_args(argv)
    if args.url is None and not args.dsn and service_up(DEFAULT_URL):
        args.url = DEFAULT_URL
    where = args.url or ("ClickHouse server" if args.dsn else f"chdb {args.data_dir}")
    args.out.mkdir(parents=True, exist_ok=True)
    runner = open_runner(args)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    index = [f"# Accounting reports\n\nGenerated {now} from {where} by `make report`.\n"]
    failed = 0
    try:
        for f in sorted(args.sql_dir.glob("*.sql")):
            sql = f.read_text()
            try:
                r = runner.query(sql)
            except Exception as exc:
                failed += 1
                log.error("%s failed: %s", f.name, exc)
                index.append(f"## {f.stem}\n\nFAILED: {exc}\n")
                continue
            table = to_markdown(r)
            (args.out / f"{f.stem}.md").write_text(table)
            with (args.out / f"{f.stem}.csv").open("w", newline="") as out:
                write_csv(r, out)
            about = " ".join(
                line[2:].strip() for line in sql.splitlines() if line.startswith("--") and "plot:" not in line
            )
            index.append(f"## {f.stem}\n\n{about}\n\n{table}")
            m = _PLOT.search(sql)
            if m and plot(r, m.group(1), m.group(2), m.group(3).split(","), f.stem, args.out / f"{f.stem}.png"):
                index.append(f"![{f.stem}]({f.stem}.png)\n")
            log.info("%-24s %5d rows", f.stem, len(r.rows))
    finally:
        runner.close()
    (args.out / "README.md").write_text("\n".join(index))
    log.info("wrote %s", args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
