#!/usr/bin/env python3
"""The manual's figures, made from the committed results files.

Every table of figures in README.md and docs/benchmarks.md stands between
two markers:

    <!-- figures: NAME ARG... -->
    ...generated Markdown...
    <!-- /figures -->

NAME picks a generator below and ARGs are results directories (relative to
the repository). `--check` regenerates every block of every file and fails
on any difference, so a figure that no committed results.json backs, or
one left stale after a new run, fails the test suite
(t/023_readme_figures.pl). It also fails on a ratio written in the prose of
the performance and reproduction sections ("0.97x"), in whichever file
they are, that no generated table of the same section contains. `--write`
rewrites the blocks in place.

    python3 pgbench/readme_figures.py --check [FILE...]
    python3 pgbench/readme_figures.py --write [FILE...]

Without FILE: README.md and docs/benchmarks.md. The files together must
hold at least one block.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import article_figures  # noqa: E402
import compare_versions  # noqa: E402
import scale_growth  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The files whose figures are checked when none is named.
FILES = ("README.md", os.path.join("docs", "benchmarks.md"))
BLOCK = re.compile(r"(<!-- figures: ([^>]*?) -->\n)(.*?)(<!-- /figures -->)", re.S)
# Sections whose prose ratios must come from a generated table.
CHECKED_SECTIONS = ("## Performance", "## Reproducing the articles")


def load(path):
    with open(os.path.join(ROOT, path, "results.json")) as f:
        return json.load(f)


def interval(lo, hi, digits=3):
    return "n/a" if lo is None else f"{lo:.{digits}f}–{hi:.{digits}f}"


def ratio_cell(r, digits=3):
    return f"{r['median_ratio']:.{digits}f} ({interval(r['interval_low'], r['interval_high'], digits)})"


# The rows of the table-class comparisons (their own block).
CLASSES = "classified tables"


def overhead(path):
    """Extension / native per commit: wall clock, CPU and instructions."""
    data = load(path)
    rows, instr = data["rows"], data.get("instruction_rows", [])
    by = {(r["comparison"], r["workload"].split(",")[0]): r for r in rows}
    # The backend's own count; for the WAL buffer the report also sums all
    # server processes (a row of its own, not shown here).
    ins = {}
    for r in instr:
        ins.setdefault((r["comparison"], r["workload"].split(",")[0]), r)
    out = ["| comparison | procedure loop: time | procedure loop: backend CPU | procedure loop: instructions "
           "| client statements: instructions | pgbench 1 client: time | pgbench 4 clients: time |",
           "|---|---|---|---|---|---|---|"]
    seen = []
    for r in rows:
        if (r["comparison"] not in seen and not r["comparison"].startswith("cached_nextval")
                and CLASSES not in r["comparison"]):
            seen.append(r["comparison"])
    for comp in seen:
        loop = by[(comp, "procedure loop")]
        cpu = loop["cpu"]
        cells = [ratio_cell(loop), ratio_cell(cpu)]
        for key in ("procedure loop", "client statements (the pgbench script)"):
            cells.append(ratio_cell(ins[(comp, key)], 4) if (comp, key) in ins else "—")
        p1 = [r for r in rows if r["comparison"] == comp and r["workload"].startswith("pgbench, 1 ")]
        p4 = [r for r in rows if r["comparison"] == comp and r["workload"].startswith("pgbench, 4 ")]
        cells += [ratio_cell(p1[0]) if p1 else "—", ratio_cell(p4[0]) if p4 else "—"]
        out.append(f"| {comp} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(f"Medians of per-pair ratios (extension / native, per commit), 95% interval in brackets "
               f"(order statistics; exact coverage {data['coverage']:.1%} for {data['rounds']} pairs); "
               f"{data['rounds']} pairs for time and CPU, {data.get('instr_rounds', 0)} for instructions "
               f"(server: {data['server_version'].split(' on ')[0]}).")
    extra = []
    for comp in seen:
        r = ins.get((comp, "procedure loop"))
        if r:
            extra.append(f"{comp}: {r['a_median'] - r['b_median']:+,} ({r['median_ratio'] - 1:+.1%})")
    if extra:
        out += ["", "Instructions per commit in the procedure loop, first side minus second: " + "; ".join(extra) + "."]
    return out


def sequences(path):
    """cached_nextval() against nextval(): throughput and instructions."""
    data = load(path)
    out = ["| workload | throughput, cached_nextval / nextval | calls/s (cached / native) | backend CPU per call "
           "(cached / native) |", "|---|---|---|---|"]
    for r in data["rows"]:
        if not r["comparison"].startswith("cached_nextval"):
            continue
        cpu = r.get("cpu")
        cpu_cell = f"{cpu['median_ratio']:.3f} ({interval(cpu['interval_low'], cpu['interval_high'])})" if cpu else "—"
        out.append(f"| {r['workload']} | {ratio_cell(r)} | {r['a_median']:,.0f} / {r['b_median']:,.0f} | {cpu_cell} |")
    for r in data.get("instruction_rows", []):
        if r["comparison"].startswith("cached_nextval"):
            out.append(f"| instructions per call: {r['workload']} | {ratio_cell(r, 4)} (instructions, cached / native) "
                       f"| {r['a_median']:,} / {r['b_median']:,} instructions | |")
    if data.get("scaling"):
        out += ["", "Scaling from 1 to 4 clients (median of per-pair 4-client / 1-client throughput): "
                + ", ".join(f"{fn} {v:.2f}x" for fn, v in data["scaling"].items()) + "."]
    return out


def table_classes(path):
    """The class lookup at commit: classified tables against none (FORCED)."""
    data = load(path)
    rows, instr = data["rows"], data.get("instruction_rows", [])
    out = ["| comparison | procedure loop: time | procedure loop: backend CPU | procedure loop: instructions "
           "| pgbench 1 client: time |", "|---|---|---|---|---|"]
    seen = []
    for r in rows:
        if r["comparison"] not in seen and CLASSES in r["comparison"]:
            seen.append(r["comparison"])
    extra = []
    for comp in seen:
        loop = next(r for r in rows if r["comparison"] == comp and r["workload"].startswith("procedure loop"))
        p1 = next(r for r in rows if r["comparison"] == comp and r["workload"].startswith("pgbench, 1 "))
        ins = next((r for r in instr if r["comparison"] == comp), None)
        out.append(f"| {comp} | {ratio_cell(loop)} | {ratio_cell(loop['cpu'])} | "
                   f"{ratio_cell(ins, 4) if ins else '—'} | {ratio_cell(p1)} |")
        if ins:
            extra.append(f"{comp}: {ins['a_median'] - ins['b_median']:+,} ({ins['median_ratio'] - 1:+.2%})")
    out.append("")
    out.append(f"Medians of per-pair ratios (with classes / without, per commit), 95% interval in brackets "
               f"(order statistics; exact coverage {data['coverage']:.1%} for {data['rounds']} pairs); "
               f"{data['rounds']} pairs for time and CPU, {data.get('instr_rounds', 0)} for instructions "
               f"(server: {data['server_version'].split(' on ')[0]}).")
    if extra:
        out += ["", "Instructions per commit in the procedure loop, with classes minus without: "
                + "; ".join(extra) + "."]
    return out


def pick(rows, **match):
    return compare_versions.row(rows, **match)


def highlights(path):
    """The articles' headline experiments, ours beside theirs."""
    data = load(path)
    res = data["results"]
    out = [f"| experiment ({data['scale']} scale) | durable | delayed | ratio ours | ratio article |",
           "|---|---|---|---|---|"]
    e1 = res.get("1", {}).get("rows", [])
    if len(e1) >= 2:
        d, x = e1[0], e1[1]
        out.append(f"| 1. {d['transactions']:,} single-row transactions (s) | {d['seconds']:.2f} | {x['seconds']:.2f} "
                   f"| {d['seconds'] / x['seconds']:.1f}x | {16 / 3:.1f}x (16 s / 3 s, 99,999 calls) |")
        if "wal_writes" in d:
            out.append(f"| 1. same, WAL writes (fsyncs) | {d['wal_writes']:,} ({d['flushes']:,}) "
                       f"| {x['wal_writes']:,} ({x['flushes']:,}) | | |")
        else:
            out.append(f"| 1. same, WAL flushes | {d['flushes']:,} | {x['flushes']:,} | | |")
        if "per_commit_us" in d:
            out.append(f"| 1. same, per commit (µs) | {d['per_commit_us']} | {x['per_commit_us']} | | article "
                       f"{d['article_per_commit_us']} / {x['article_per_commit_us']} |")
    e2 = res.get("2", {}).get("rows", [])
    n = max((r["rows"] for r in e2), default=0)
    for table, art in (("permanent", "8.8x (193 s / 22 s)"), ("temporary", "1.1x (19 s / 18 s)")):
        d = pick(e2, table=table, durability="durable", transactions=n)
        x = pick(e2, table=table, durability="delayed", transactions=n)
        if d and x:
            out.append(f"| 2. {n:,} transactions, {table} table (s) | {d['seconds']:.2f} | {x['seconds']:.2f} "
                       f"| {d['seconds'] / x['seconds']:.1f}x | {art} |")
            if table == "permanent" and "wal_writes" in d:
                out.append(f"| 2. same, WAL writes (fsyncs) | {d['wal_writes']:,} ({d['flushes']:,}) | "
                           f"{x['wal_writes']:,} ({x['flushes']:,}) | | log flushes 1,000,036 / 95,407 "
                           "(1,000,000 rows) |")
            elif table == "permanent":
                out.append(f"| 2. same, WAL flushes | {d['flushes']:,} | {x['flushes']:,} | | "
                           "1,000,036 / 95,407 (1,000,000 rows) |")
    e3 = res.get("3", {}).get("rows", [])
    for cache in (1, 50, 10000):
        d = pick(e3, durability="durable", sequence="permanent", cache=cache, function="cached_nextval")
        x = pick(e3, durability="delayed", sequence="permanent", cache=cache, function="cached_nextval")
        if d and x:
            if "wal_writes" in d:
                out.append(f"| 3. {d['values']:,} cached_nextval() values, CACHE {cache}: WAL writes (fsyncs) "
                           f"| {d['wal_writes']:,} ({d['flushes']:,}) | {x['wal_writes']:,} ({x['flushes']:,}) | "
                           f"| log flushes {d['article_flushes']:,} / {x['article_flushes']:,} |")
            else:
                out.append(f"| 3. {d['values']:,} cached_nextval() values, CACHE {cache}: WAL flushes "
                           f"| {d['flushes']:,} | {x['flushes']:,} | | article {d['article_flushes']:,} / "
                           f"{x['article_flushes']:,} |")
    e4 = res.get("4", {}).get("rows", [])
    for case in ("article", "ours"):
        rows4 = [r for r in e4 if (r.get("case") or "ours").startswith(case)]
        if len(rows4) >= 2:
            d, x = rows4[0], rows4[1]
            what = (f"{d['clients']} clients, {d['commits']:,} transactions of {d.get('rows_per_commit', 1):,} rows"
                    if case == "article" else f"{d['clients']} clients, {d['commits']:,} single-row commits")
            art = f"{54 / 48:.3f}x (54 s / 48 s)" if case == "article" else "— (not the article's workload)"
            out.append(f"| 4. {what} (s) | {d['seconds']:.2f} | {x['seconds']:.2f} "
                       f"| {d['seconds'] / max(x['seconds'], 1e-9):.2f}x | {art} |")
    e6 = res.get("6", {}).get("rows", [])
    if e6:
        out += ["", f"| experiment 6 ({data['scale']} scale) | 64 MB segments (s) | 1 MB segments (s) "
                "| ratio ours (1 MB / 64 MB) | WAL writes (fsyncs), 64 MB / 1 MB | ratio article (20,000 / 16 VLFs) |",
                "|---|---|---|---|---|---|"]
    for step, art in (("insert", 1069 / 281), ("update", 1554 / 174), ("delete", 936 / 193)):
        small, big = pick(e6, step=step, wal_segment_mb=1), pick(e6, step=step, wal_segment_mb=64)
        if small and big:
            counts = (f"{big['wal_writes']:,} ({big['flushes']:,}) / {small['wal_writes']:,} ({small['flushes']:,})"
                      if "wal_writes" in big else f"{big['flushes']:,} / {small['flushes']:,}")
            out.append(f"| {big['rows']:,}-row {step} | {big['seconds']:.2f} | {small['seconds']:.2f} "
                       f"| {small['seconds'] / max(big['seconds'], 1e-9):.2f}x | {counts} | {art:.1f}x |")
    return out


def wal_buffer(path):
    """Experiment 5: durable commits with the WAL buffer."""
    res = load(path)["results"].get("5")
    if not res:
        return ["(experiment 5 did not run)"]
    rows = {r["variant"]: r for r in res["rows"]}
    fs, buf, dl = rows["durable, WAL fsync"], rows["durable, WAL buffer on /dev/shm"], rows["delayed (forced)"]
    tput = {(r["variant"], r["clients"]): r["tps"] for r in res["extra_tables"][0][2]}
    out = ["| workload | durable, WAL fsync | durable, WAL buffer | delayed (`forced`) |", "|---|---|---|---|",
           f"| server-side loop, {fs['transactions']:,} commits (s, median run) | {fs['seconds']:.2f} | "
           f"{buf['seconds']:.2f} | {dl['seconds']:.2f} |",
           f"| same, real WAL fsyncs | {fs['flushes']:,} | {buf['flushes']:,} ({buf['fsyncs_avoided']:,} avoided, "
           f"{buf['buffer_drains']} drains) | {dl['flushes']:,} |"]
    for clients in (1, 4):
        out.append(f"| pgbench single-row inserts, {clients} client(s) (tps) | {tput[(fs['variant'], clients)]:,} | "
                   f"{tput[(buf['variant'], clients)]:,} | {tput[(dl['variant'], clients)]:,} |")
    out += [""] + [f"- {n}" for n in res["notes"][:3]]
    return out


def versions(*paths):
    """The quick experiments on several major versions."""
    return compare_versions.table([os.path.join(ROOT, p) for p in paths])


def loss_budget(path):
    """Experiment 7: throughput under each loss budget."""
    res = load(path)["results"]["7"]
    cells = {}
    for r in res["rows"]:
        ratio = r["ratio_to_unbounded"]
        iv = r["ratio_interval"].split(" (")[0].replace("-", "–")
        cells[(r["variant"], r["workload"])] = ratio if iv == "baseline" else f"{ratio} ({iv})"
    variants, workloads = [], []
    for r in res["rows"]:
        if r["variant"] not in variants:
            variants.append(r["variant"])
        if r["workload"] not in workloads:
            workloads.append(r["workload"])
    out = ["| variant | " + " | ".join(workloads) + " |", "|---|" + "---|" * len(workloads)]
    for v in variants:
        out.append(f"| {v} | " + " | ".join(cells.get((v, w), "—") for w in workloads) + " |")
    return out


def growth(small, big):
    """How each experiment's time grows from one scale to the other."""
    return scale_growth.table(load(small), load(big))


GENERATORS = dict(overhead=overhead, sequences=sequences, highlights=highlights, wal_buffer=wal_buffer,
                  versions=versions, loss_budget=loss_budget, growth=growth, table_classes=table_classes,
                  articles=article_figures.articles)


def render(spec):
    name, *args = spec.split()
    return "\n".join(GENERATORS[name](*args)) + "\n"


# Figures the prose may state without a results file: the goals.
GOALS = {"2%", "0.9x", "0.95x"}
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:x|%)(?!\w)")


def prose_ratios_unbacked(text):
    """Ratios ("1.02x") and percentages in the prose of the checked sections
    that no generated block of the same section contains, and placeholders
    left in (ALL_CAPS_WORDS)."""
    problems = []
    sections = re.split(r"(?m)^(?=## )", text)
    for sec in sections:
        if not sec.startswith(CHECKED_SECTIONS):
            continue
        blocks = "".join(m.group(3) for m in BLOCK.finditer(sec))
        prose = BLOCK.sub("", sec)
        backed = set(FIGURE.findall(blocks)) | GOALS
        for figure in FIGURE.findall(prose):
            if figure not in backed:
                problems.append(f"{sec.splitlines()[0]}: prose ratio {figure} is in no generated table of the section")
        for word in re.findall(r"\b[A-Z]{3,}_[A-Z_]{3,}\b", re.sub(r"`[^`]*`", "", prose)):
            problems.append(f"{sec.splitlines()[0]}: placeholder {word} left in the text")
    return problems


def display_name(path):
    full = os.path.abspath(path)
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else path


def check_file(path, write):
    """Regenerates the blocks of one file; returns its problems and block count."""
    with open(path) as f:
        text = f.read()
    name = display_name(path)
    problems = []

    def replace(m):
        try:
            new = render(m.group(2))
        except (OSError, KeyError, ValueError, IndexError, TypeError, AttributeError) as e:
            problems.append(f"{name}: block '{m.group(2)}': its results cannot be read ({type(e).__name__}: {e})")
            return m.group(0)
        if new != m.group(3):
            problems.append(f"{name}: block '{m.group(2)}' differs from its results:\n--- {name}\n{m.group(3)}"
                            f"--- results\n{new}")
        return m.group(1) + new + m.group(4)

    updated = BLOCK.sub(replace, text)
    if write:
        with open(path, "w") as f:
            f.write(updated)
        problems = [p for p in problems if "differs from its results" not in p]
    problems += [f"{name}: {p}" for p in prose_ratios_unbacked(updated)]
    return problems, len(BLOCK.findall(text))


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("--check", "--write"):
        sys.exit(__doc__)
    paths = sys.argv[2:] or [os.path.join(ROOT, f) for f in FILES]
    problems, blocks, counts = [], 0, []
    for path in paths:
        try:
            found, n = check_file(path, sys.argv[1] == "--write")
        except OSError as e:
            found, n = [f"{path}: cannot be read ({e})"], 0
        problems += found
        blocks += n
        counts.append(f"readme_figures: {display_name(path)}: {n} blocks")
    if blocks == 0:
        problems.append("no figures blocks found")
    for p in problems:
        print(p)
    for line in counts:
        print(line)
    print(f"readme_figures: {blocks} blocks, {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
