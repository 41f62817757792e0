"""Side by side: the same quick-scale experiments on several PostgreSQL
major versions, from the results.json files the main job writes.

    python3 pgbench/compare_versions.py pgbench/results/quick pgbench/results/quick-pg17 ...

Prints a Markdown table of what can differ between versions: WAL volume,
WAL fsyncs (group commit), and the durable/delayed ratios. Seconds are
printed only as ratios measured within one run: runs on different days on a
shared VM are not comparable in absolute time.
"""
import json
import os
import re
import sys


def load(path):
    with open(os.path.join(path, "results.json")) as f:
        data = json.load(f)
    version = data.get("server_version")
    if not version:
        # Reports written before results.json recorded it name the server
        # on their Machine line.
        with open(os.path.join(path, "report.md")) as f:
            m = re.search(r"postgres \(PostgreSQL\) ([0-9.]+)", f.read())
        version = m.group(1) if m else "unknown"
    return version, data["results"]


def row(rows, **match):
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def figures(results):
    """(label, value) pairs, None where the experiment did not run."""
    out = []
    # Experiments 1 and 4 list the durable run first and the article's
    # delayed run second (their labels changed between versions of the runner).
    e1 = results.get("1", {}).get("rows", [])
    durable, delayed = (e1 + [None, None])[:2]
    if durable and delayed:
        out.append(("1. about 100,000 single-row commits: durable / delayed time", f"{durable['seconds'] / delayed['seconds']:.1f}x"))
        out.append(("1. WAL fsyncs, durable / delayed", f"{durable['flushes']} / {delayed['flushes']}"))
    e2 = results.get("2", {}).get("rows", [])
    small = row(e2, table="permanent", durability="durable", transactions=200000)
    if small:
        out.append(("2. 200,000 durable commits, permanent table: WAL fsyncs", str(small["flushes"])))
    e4 = results.get("4", {}).get("rows", [])
    # Since experiment 4 has two cases, the many-small-commits case is the
    # one comparable with earlier runs (which had only that one).
    small_commits = [r for r in e4 if (r.get("case") or "ours").startswith("ours")]
    durable4, delayed4 = (small_commits + [None, None])[:2]
    if durable4 and delayed4:
        out.append(("4. 5 clients, 50,000 durable commits: WAL fsyncs (group commit)", str(durable4["flushes"])))
        out.append(("4. durable / delayed time (many small commits)",
                    f"{durable4['seconds'] / max(delayed4['seconds'], 1e-9):.1f}x"))
    article4 = [r for r in e4 if (r.get("case") or "").startswith("article")]
    if len(article4) >= 2:
        out.append(("4. durable / delayed time (the article's reading: one transaction per iteration)",
                    f"{article4[0]['seconds'] / max(article4[1]['seconds'], 1e-9):.2f}x"))
    e5 = results.get("5", {}).get("rows", [])
    fsync5, buf5 = row(e5, variant="durable, WAL fsync"), row(e5, variant="durable, WAL buffer on /dev/shm")
    if fsync5 and buf5:
        out.append(("5. durable with the WAL buffer: fsyncs avoided / real fsyncs",
                    f"{buf5['fsyncs_avoided']} / {buf5['flushes']}"))
        out.append(("5. WAL fsync / WAL buffer time", f"{fsync5['seconds'] / max(buf5['seconds'], 1e-9):.1f}x"))
    e6 = results.get("6", {}).get("rows", [])
    for step in ("insert", "update", "delete"):
        r = row(e6, step=step, wal_segment_mb=64)
        if r:
            out.append((f"6. WAL written by the 300,000-row {step} (MB)", str(r["wal_mb"])))
    e8 = results.get("8", {}).get("rows", [])
    worst = {}
    for r in e8:
        if isinstance(r.get("lost_wal_kb"), (int, float)):
            worst[r["variant"]] = max(worst.get(r["variant"], 0), r["lost_wal_kb"])
    if len(worst) >= 2:
        out.append(("8. power cuts: most WAL lost, default settings / max_loss_bytes = 64kB (KB)",
                    " / ".join(f"{v:g}" for v in worst.values())))
    return out


def table(paths):
    """Markdown lines: one column per results directory."""
    runs = [load(p) for p in paths]
    figs = [dict(figures(results)) for _, results in runs]
    labels = []
    for t in figs:
        labels += [k for k in t if k not in labels]
    out = ["| figure | " + " | ".join(f"PostgreSQL {v}" for v, _ in runs) + " |", "|---|" + "---|" * len(runs)]
    for label in labels:
        out.append(f"| {label} | " + " | ".join(t.get(label, "—") for t in figs) + " |")
    return out


def main():
    paths = sys.argv[1:]
    if not paths:
        sys.exit(__doc__)
    print("\n".join(table(paths)))


if __name__ == "__main__":
    main()
