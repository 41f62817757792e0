"""The report of pgbench/run.py: markdown tables, charts, results.json.
"""
import json
import os
import platform
import subprocess

import harness

def fmt_secs(s):
    return f"{s:.2f}" if s < 100 else f"{s:.0f}"


def label_of(row, key):
    if isinstance(key, tuple):
        return " / ".join(str(row[k]) for k in key)
    return str(row[key])


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def draw_normalised_times(ax, rows):
    """Ours and the article's durations side by side, each divided by its
    own longest row that has both: the shape compares where the machines'
    speeds do not."""
    both = [r for r in rows if is_number(r.get("article_seconds"))]
    ours_max = max(r["seconds"] for r in both) or 1e-9
    art_max = max(r["article_seconds"] for r in both) or 1e-9
    ys = range(len(rows))
    ours = [r["seconds"] / ours_max if r in both else 0 for r in rows]
    art = [r["article_seconds"] / art_max if r in both else 0 for r in rows]
    h = 0.4
    ax.barh([y - h / 2 for y in ys], ours, height=h, color="#4477aa", label="ours")
    ax.barh([y + h / 2 for y in ys], art, height=h, color="#ddaa33", label="article")
    ax.set_yticks(list(ys), [""] * len(rows))
    ax.invert_yaxis()
    ax.set_xlabel("time / longest row's time (rows with an article figure)")
    ax.set_title("ours vs the article, normalised")
    ax.legend(fontsize=8)


def draw_chart(result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    kind, key = result["chart"]
    if kind == "module":  # an experiment module that draws its own chart
        return __import__(key).draw_chart(result, path)
    if kind == "lines":
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for label, pts in key.items():
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label)
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("WAL flushes per second")
        ax.set_title(result["title"] + ": Log Flushes/sec")
        ax.legend()
        ax.grid(alpha=0.3)
    else:
        rows = result["rows"]
        labels = [label_of(r, key) for r in rows]
        with_article = any(is_number(r.get("article_seconds")) for r in rows)
        fig, axes = plt.subplots(1, 3 if with_article else 2,
                                 figsize=(17 if with_article else 12, max(3.5, 0.45 * len(rows) + 1.5)))
        a1, a2 = axes[0], axes[1]
        ys = range(len(rows))
        a1.barh(ys, [r["seconds"] for r in rows], color="#4477aa")
        a1.set_yticks(list(ys), labels, fontsize=8)
        a1.invert_yaxis()
        a1.set_xlabel("seconds (server clock)")
        a1.set_title("duration")
        # The article's log flushes are log-block writes (write-through):
        # beside them, our WAL writes as well as our WAL fsyncs.
        with_writes = all(is_number(r.get("wal_writes")) for r in rows)
        h = 0.4 if with_writes else 0.8
        a2.barh([y - (h / 2 if with_writes else 0) for y in ys], [max(r["flushes"], 0.5) for r in rows],
                height=h, color="#cc6677", label="ours: WAL fsyncs")
        if with_writes:
            a2.barh([y + h / 2 for y in ys], [max(r["wal_writes"], 0.5) for r in rows], height=h,
                    color="#88ccee", label="ours: WAL writes")
        art = [(y, r["article_flushes"]) for y, r in zip(ys, rows) if is_number(r.get("article_flushes"))]
        if art:
            a2.scatter([max(v, 0.5) for _, v in art], [y for y, _ in art], marker="D", color="#ddaa33",
                       zorder=3, label="article: log flushes (log-block writes)")
        if art or with_writes:
            a2.legend(fontsize=8)
        a2.set_yticks(list(ys), [""] * len(rows))
        a2.invert_yaxis()
        a2.set_xscale("log")
        a2.set_xlabel("count (log scale)")
        a2.set_title("log flushes: WAL fsyncs and writes")
        if with_article:
            draw_normalised_times(axes[2], rows)
        fig.suptitle(result["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def markdown_table(result):
    cols = result["columns"]
    # A column's header may say more than its key (e.g. which of ours an
    # article figure corresponds to).
    headers = [result.get("headers", {}).get(c, c) for c in cols]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        cells = []
        for col in cols:
            v = r.get(col, "")
            if col == "seconds" and isinstance(v, float):
                v = fmt_secs(v)
            elif isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10000:
                v = f"{v:,}"
            cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_description():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(open("/proc/meminfo").readline().split()[1])
        mem = f", {kb // 1048576} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    pg = subprocess.run([os.path.join(harness.PGBIN, "postgres"), "--version"], capture_output=True, text=True).stdout.strip()
    return f"{os.cpu_count()} x {cpu}{mem}, {platform.platform()}, {pg}"


def write_report(out, scale_name, scale, results, skipped, elapsed, server_version, kept=()):
    md = [f"# Delayed durability experiments ({scale_name} scale)", "",
          f"Machine: {machine_description()}. Server: PostgreSQL {server_version}.", "",
          f"Run took {elapsed:.0f} s. Durations are the server clock around the work only; flushes are WAL "
          "fsyncs (PostgreSQL's own count: the `pg_stat_wal.wal_sync` delta, `pg_stat_io`'s WAL fsyncs "
          "from 18). Absolute seconds on a shared VM move with load: compare "
          "the ratios, measured side by side in one run.", ""]
    if kept:
        md += [f"Experiments {', '.join(kept)} were kept from an earlier run into this directory (same scale and "
               f"server, `run.py --keep`); the time above is the last run's.", ""]
    if scale_name != "full":
        md += [f"Counts are scaled down ({scale_name} scale: {scale}); the article figures are "
               "for the articles' full sizes, so compare ratios, not absolute values. "
               "`python3 pgbench/run.py --scale full` runs the articles' sizes.", ""]
    for exp_id, res in results:
        md += [f"## {res['title']}", ""]
        if exp_id in kept or res.get("machine"):
            md += [f"Run on: {res['machine']}." if res.get("machine") else
                   "Kept from an earlier run, whose machine was not recorded.", ""]
        md += [markdown_table(res), ""]
        for title, cols, rows in res.get("extra_tables", []):
            md += [f"### {title}", "", markdown_table(dict(columns=cols, rows=rows)), ""]
        md += [f"- {n}" for n in res.get("notes", [])]
        if res.get("chart_file"):
            md += ["", f"![{res['title']}]({res['chart_file']})"]
        md.append("")
    for exp_id, reason in skipped:
        md += [f"## Experiment {exp_id}: not available", "", reason, ""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"scale": scale_name, "server_version": server_version, "results": {k: v for k, v in results},
                   "skipped": dict(skipped), "kept": list(kept)}, f, indent=1, default=str)
