"""Experiment 7 of pgbench/run.py: the loss budget.

Throughput of single-row commits (a server-side procedure loop, and pgbench
with 1 and 4 clients) for durable commits, delayed commits without a bound,
and delayed commits bounded by delayed_durability.max_loss_bytes (64kB, 1MB,
16MB) or delayed_durability.max_loss_time (10ms, 100ms), with the lost-commit
ring (delayed_durability.track_lost_commits) on and off. A delayed commit
that would exceed its budget flushes WAL up to its own commit record before
returning (counted in delayed_durability_stats.commits_budget_flushed), so
the budgets span the continuum between durable and delayed.

Method: short rounds, every variant once per round in a rotating order
(reversed every other round), per-round throughput; each variant's median,
and the median of its per-round throughput ratios against "delayed,
unbounded, ring off" with a distribution-free order-statistic interval.
Variants are applied with ALTER SYSTEM + pg_reload_conf() (the ring's GUC
is sighup), waiting until a new session sees all of them.
"""
import math
import os
import shutil
import statistics
import time

from harness import Unavailable

HERE = os.path.dirname(os.path.abspath(__file__))

# The experiment's own objects (on top of pgbench/setup.sql's t1): a
# time-bounded loop of single-row inserts, each committed, so that every
# variant's round lasts about as long whatever its throughput. The clock is
# read every 16 commits.
SETUP_SQL = """
CREATE OR REPLACE PROCEDURE loss_budget_loop(secs float8)
LANGUAGE plpgsql AS $$
DECLARE
  deadline timestamptz := clock_timestamp() + secs * interval '1 second';
  i int := 0;
BEGIN
  LOOP
    i := i + 1;
    INSERT INTO t1 VALUES (i);
    COMMIT;
    EXIT WHEN i % 16 = 0 AND clock_timestamp() >= deadline;
  END LOOP;
END $$;
"""

GUCS = ("delayed_durability.mode", "delayed_durability.track_lost_commits",
        "delayed_durability.max_loss_bytes", "delayed_durability.max_loss_time")

BASELINE = "delayed, unbounded, ring off"
RING_ON = "delayed, unbounded, ring on"
NEVER_HIT = "ring on, budget never hit (1GB / 1h)"

# (label, mode, track_lost_commits, max_loss_bytes, max_loss_time, chart
# axis and position). Delayed variants use mode forced: every commit delayed.
VARIANTS = [
    ("durable", "disabled", "on", "0", "0", None),
    (BASELINE, "forced", "off", "0", "0", None),
    (RING_ON, "forced", "on", "0", "0", None),
    (NEVER_HIT, "forced", "on", "1GB", "1h", None),
    ("ring on, max_loss_bytes 64kB", "forced", "on", "64kB", "0", ("bytes", "64kB")),
    ("ring on, max_loss_bytes 1MB", "forced", "on", "1MB", "0", ("bytes", "1MB")),
    ("ring on, max_loss_bytes 16MB", "forced", "on", "16MB", "0", ("bytes", "16MB")),
    ("ring on, max_loss_time 10ms", "forced", "on", "0", "10ms", ("time", "10ms")),
    ("ring on, max_loss_time 100ms", "forced", "on", "0", "100ms", ("time", "100ms")),
]

WORKLOADS = ("server loop", "pgbench, 1 client", "pgbench, 4 clients")

# One session per loop run: the clock around the CALL only, this session's
# WAL fsyncs (PostgreSQL's count: pg_stat_wal.wal_sync, pg_stat_io from 18; statistics forced out before reading, as
# in harness.measure), the database's budget flushes and the WAL written
# around it; the commits are the rows the loop inserted into the emptied t1.
LOOP_TEMPLATE = """
TRUNCATE t1;
SELECT pg_stat_force_next_flush();
SELECT delayed_durability_wal_fsyncs() AS s0 \\gset
SELECT commits_budget_flushed AS b0 FROM delayed_durability_stats WHERE datname = current_database() \\gset
SELECT pg_current_wal_insert_lsn() AS l0 \\gset
SELECT clock_timestamp() AS t0 \\gset
CALL loss_budget_loop({secs});
SELECT extract(epoch FROM clock_timestamp() - :'t0') AS secs \\gset
SELECT pg_current_wal_insert_lsn() - :'l0' AS wal \\gset
SELECT pg_stat_force_next_flush();
SELECT 'result ' || :secs || ' ' || (SELECT count(*) FROM t1)
       || ' ' || (delayed_durability_wal_fsyncs() - :s0)
       || ' ' || (SELECT commits_budget_flushed - :b0 FROM delayed_durability_stats
                   WHERE datname = current_database())
       || ' ' || :wal;
"""


def counters(c):
    """(WAL fsyncs, budget flushes in this database, WAL insert position in
    bytes), statistics forced out first as in harness.wal_sync_total."""
    out = c.value("SELECT pg_stat_force_next_flush();\n"
                  "SELECT delayed_durability_wal_fsyncs() || ' ' || "
                  "(SELECT commits_budget_flushed FROM delayed_durability_stats WHERE datname = current_database()) "
                  "|| ' ' || (pg_current_wal_insert_lsn() - '0/0');")
    s, b, lsn = out.split()
    return int(s), int(b), int(float(lsn))


def check_available(c):
    """Raises Unavailable when the build lacks the loss budget."""
    if c.value("SELECT count(*) FROM pg_proc WHERE proname = 'wait_durable'") == "0":
        raise Unavailable("needs the loss budget (wait_durable(), delayed_durability.max_loss_bytes), "
                          "not in this build")
    names = ", ".join(f"'{g}'" for g in GUCS)
    if int(c.value(f"SELECT count(*) FROM pg_settings WHERE name IN ({names})")) != len(GUCS):
        raise Unavailable("needs delayed_durability.max_loss_bytes, max_loss_time and track_lost_commits, "
                          "not in this build")
    if c.value("SELECT count(*) FROM pg_attribute WHERE attrelid = 'delayed_durability_stats'::regclass "
               "AND attname = 'commits_budget_flushed'") == "0":
        raise Unavailable("needs delayed_durability_stats.commits_budget_flushed (extension 0.4.0); "
                          "ALTER EXTENSION delayed_durability UPDATE")


def expected_settings(c, variant):
    """The four settings as SHOW prints them, normalised by the server (so
    that '1GB' and '1048576kB' compare equal); track_lost_commits cannot be
    SET in a session, a boolean prints as given."""
    _, mode, ring, max_bytes, max_time, _ = variant
    out = c.psql(f"SET delayed_durability.mode = '{mode}';\n"
                 f"SET delayed_durability.max_loss_bytes = '{max_bytes}';\n"
                 f"SET delayed_durability.max_loss_time = '{max_time}';\n"
                 "SELECT current_setting('delayed_durability.mode') || '|' || "
                 "current_setting('delayed_durability.max_loss_bytes') || '|' || "
                 "current_setting('delayed_durability.max_loss_time');")
    m, b, t = out[-1].split("|")
    return (m, ring, b, t)


def apply_variant(c, variant, expected):
    """ALTER SYSTEM + pg_reload_conf(), then waits until a new session sees
    the variant's settings (the reload is asynchronous)."""
    _, mode, ring, max_bytes, max_time, _ = variant
    c.psql(f"ALTER SYSTEM SET delayed_durability.mode = '{mode}';\n"
           f"ALTER SYSTEM SET delayed_durability.track_lost_commits = {ring};\n"
           f"ALTER SYSTEM SET delayed_durability.max_loss_bytes = '{max_bytes}';\n"
           f"ALTER SYSTEM SET delayed_durability.max_loss_time = '{max_time}';\n"
           "SELECT pg_reload_conf();")
    query = "SELECT " + " || '|' || ".join(f"current_setting('{g}')" for g in GUCS) + ";"
    deadline = time.monotonic() + 10
    while True:
        seen = tuple(c.value(query).split("|"))
        if seen == expected:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"settings not applied after reload: expected {expected}, a new session sees {seen}")
        time.sleep(0.05)


def reset_settings(c):
    c.psql("".join(f"ALTER SYSTEM RESET {g};\n" for g in GUCS) + "SELECT pg_reload_conf();")


def median_interval(xs, level=0.95):
    """The median and a distribution-free interval for it: the order
    statistics x(k), x(n+1-k) with the largest k whose coverage
    1 - 2 P(Binomial(n, 1/2) <= k-1) is still at least `level` (or min/max,
    with its lower coverage, when n is too small). Returns (median, low,
    high, coverage); low/high None for fewer than 2 values."""
    s = sorted(xs)
    n = len(s)
    med = statistics.median(s)
    if n < 2:
        return med, None, None, None

    def cdf(j):
        return sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n

    k = 1
    while k + 1 <= n // 2 and 1 - 2 * cdf(k) >= level:
        k += 1
    return med, s[k - 1], s[n - k], 1 - 2 * cdf(k - 1)


def fmt_interval(lo, hi, cov):
    if lo is None:
        return "n/a (1 round)"
    return f"{lo:.3f}-{hi:.3f} ({cov * 100:.1f}%)"


def fmt_rate(x):
    if x == 0:
        return "0"
    return f"{x:.3g}" if x >= 0.001 else f"{x:.2e}"


def verdict(goal, med, lo, hi):
    met = "met" if med >= goal else "NOT met"
    if lo is None:
        where = "one round, no interval"
    elif lo >= goal:
        where = "interval entirely above the goal"
    elif hi < goal:
        where = "interval entirely below the goal"
    else:
        where = "interval straddles the goal"
    return f"{met} ({where})"


def exp7_loss_budget(c, scale, log):
    """The loss budget: throughput against max_loss_bytes / max_loss_time."""
    check_available(c)
    rounds, loop_secs, bench_secs = scale["e7"]
    c.psql(SETUP_SQL)
    script = os.path.join(c.dir, "insert_single.sql")
    shutil.copy(os.path.join(HERE, "insert_single.sql"), script)
    os.chmod(script, 0o644)
    writer_delay = c.value("SHOW wal_writer_delay")
    writer_flush_after = c.value("SHOW wal_writer_flush_after")
    expected = {v[0]: expected_settings(c, v) for v in VARIANTS}
    # runs[(workload, variant)] = one dict per round
    runs = {(w, v[0]): [] for w in WORKLOADS for v in VARIANTS}
    try:
        for r in range(rounds):
            # Rotating order, reversed every other round, so that no variant
            # always runs first after the checkpoint or after the same one.
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            if r % 2:
                order.reverse()
            c.psql("TRUNCATE t1; CHECKPOINT;")
            for variant in order:
                label = variant[0]
                apply_variant(c, variant, expected[label])
                log(f"exp 7: round {r + 1}/{rounds}: {label}: server loop {loop_secs} s, pgbench 1 and 4 clients "
                    f"{bench_secs} s")
                out = c.psql(LOOP_TEMPLATE.format(secs=loop_secs))
                _, secs, commits, syncs, budget, wal = out[-1].split()
                secs, commits = float(secs), int(commits)
                runs[("server loop", label)].append(dict(
                    commits=commits, seconds=secs, tput=commits / max(secs, 1e-9),
                    flushes=int(syncs), budget_flushed=int(budget), wal_bytes=int(float(wal))))
                for clients, workload in ((1, "pgbench, 1 client"), (4, "pgbench, 4 clients")):
                    s0, b0, l0 = counters(c)
                    tps, done = c.pgbench(script, clients, seconds=bench_secs)
                    time.sleep(0.1)  # the clients' backends publish their WAL statistics as they exit
                    s1, b1, l1 = counters(c)
                    runs[(workload, label)].append(dict(
                        commits=done, seconds=bench_secs, tput=tps, flushes=s1 - s0, budget_flushed=b1 - b0,
                        wal_bytes=l1 - l0))
    finally:
        reset_settings(c)

    rows, summary = [], {}
    for workload in WORKLOADS:
        base = runs[(workload, BASELINE)]
        for variant in VARIANTS:
            label = variant[0]
            rs = runs[(workload, label)]
            ratios = [x["tput"] / max(b["tput"], 1e-9) for x, b in zip(rs, base)]
            med, lo, hi, cov = median_interval(ratios)
            commits = sum(x["commits"] for x in rs)
            summary[(workload, label)] = (med, lo, hi, cov)
            rows.append(dict(
                workload=workload, variant=label,
                commits_per_second=round(statistics.median(x["tput"] for x in rs)),
                ratio_to_unbounded=f"{med:.3f}",
                ratio_interval="baseline" if label == BASELINE else fmt_interval(lo, hi, cov),
                budget_flushes_per_commit=fmt_rate(sum(x["budget_flushed"] for x in rs) / max(commits, 1)),
                wal_flushes_per_commit=fmt_rate(sum(x["flushes"] for x in rs) / max(commits, 1)),
                wal_bytes_per_commit=round(sum(x["wal_bytes"] for x in rs) / max(commits, 1)),
                commits=commits))

    cov_text = ("one round: no interval" if rounds < 2 else
                f"{summary[(WORKLOADS[0], RING_ON)][3] * 100:.1f}% coverage at {rounds} rounds"
                + ("" if summary[(WORKLOADS[0], RING_ON)][3] >= 0.95 else
                   ", the widest available: 6 or more rounds give 95%"))
    notes = [
        f"Method: {rounds} round(s); each round runs every variant once, in an order rotated by one per round "
        "and reversed every other round, starting after a CHECKPOINT. Per variant and round: the server-side "
        f"procedure loop (one INSERT + COMMIT per iteration) for {loop_secs} s, then pgbench -n -T {bench_secs} "
        "with 1 and 4 clients (-j 1 and 2) running pgbench/insert_single.sql (one single-row INSERT per "
        "transaction). commits_per_second is the median over rounds; ratio_to_unbounded is the median of "
        f"the per-round throughput ratios against '{BASELINE}' (same round, same workload); ratio_interval is "
        f"its distribution-free order-statistic interval ({cov_text}). Flushes per commit are totals over all "
        "rounds divided by commits.",
        f"Delayed variants use delayed_durability.mode = forced (every commit delayed); durable uses disabled. "
        f"Settings are applied with ALTER SYSTEM + pg_reload_conf(); the server keeps its defaults "
        f"wal_writer_delay = {writer_delay} and wal_writer_flush_after = {writer_flush_after}, so without a "
        "budget the WAL writer alone bounds what a crash can lose.",
        "wal_flushes_per_commit is the delta of PostgreSQL's WAL fsync count (pg_stat_wal.wal_sync; pg_stat_io from 18): the committing backends' own fsyncs "
        "(durable commits, budget flushes) are exact; the WAL writer publishes its counts at most once a "
        "second, so with short rounds its share (most of the flushes of unbounded delayed commits) is "
        "approximate and may land in a neighbouring run. budget_flushes_per_commit "
        "(delayed_durability_stats.commits_budget_flushed) counts commits that had to flush for their budget; "
        "with several clients one fsync can serve several of them, so it can exceed wal_flushes_per_commit.",
    ]
    goals = [
        ("lost-commit ring costs at most 2% of delayed throughput", RING_ON, 0.98),
        ("ring + budget check (budget never hit) cost at most 2% of delayed throughput", NEVER_HIT, 0.98),
        ("with a 1MB byte budget at least 0.9x unbounded delayed throughput", "ring on, max_loss_bytes 1MB", 0.90),
    ]
    for text, label, goal in goals:
        parts = []
        for workload in WORKLOADS:
            med, lo, hi, cov = summary[(workload, label)]
            parts.append(f"{workload} {med:.3f}x [{fmt_interval(lo, hi, cov)}]: {verdict(goal, med, lo, hi)}")
        notes.append(f"Goal: {text} ('{label}' / '{BASELINE}' >= {goal}): " + "; ".join(parts) + ".")
    # How far apart the budgets' flushes came: a byte budget met exactly
    # flushes once per budget of WAL, a time budget once per interval.
    spacing = []
    for label, unit in (("ring on, max_loss_bytes 64kB", "bytes"), ("ring on, max_loss_bytes 1MB", "bytes"),
                        ("ring on, max_loss_time 10ms", "time"), ("ring on, max_loss_time 100ms", "time")):
        parts = []
        for workload in WORKLOADS:
            rs = runs[(workload, label)]
            flushes = sum(x["flushes"] for x in rs)
            if not flushes:
                parts.append(f"{workload} no flush")
            elif unit == "bytes":
                parts.append(f"{workload} {sum(x['wal_bytes'] for x in rs) / flushes / 1024:.0f} kB")
            else:
                parts.append(f"{workload} {sum(x['seconds'] for x in rs) * 1000 / flushes:.1f} ms")
        spacing.append(f"{label.split()[-1]}: " + ", ".join(parts))
    notes.append("WAL written per WAL flush (byte budgets) and time per WAL flush (time budgets), WAL writer "
                 "flushes included: " + "; ".join(spacing) + ".")
    # What looks wrong or surprising, stated rather than hidden.
    for workload in WORKLOADS:
        hit = sum(x["budget_flushed"] for x in runs[(workload, NEVER_HIT)])
        if hit:
            notes.append(f"Suspicious: '{NEVER_HIT}' made {hit} budget flush(es) in {workload}; "
                         "its ratio then measures more than the check.")
        for b in (BASELINE, RING_ON):
            unexpected = sum(x["budget_flushed"] for x in runs[(workload, b)])
            if unexpected:
                notes.append(f"Suspicious: '{b}' (no budget) counted {unexpected} budget flush(es) in {workload}.")
        for variant in VARIANTS[2:]:
            med, lo, hi, cov = summary[(workload, variant[0])]
            if lo is not None and lo > 1.0:
                notes.append(f"Suspicious: '{variant[0]}' ran faster than '{BASELINE}' in {workload} "
                             f"({med:.3f}x, interval {fmt_interval(lo, hi, cov)} entirely above 1).")
        for label in ("ring on, max_loss_bytes 64kB", "ring on, max_loss_time 10ms"):
            if not sum(x["budget_flushed"] for x in runs[(workload, label)]):
                notes.append(f"Suspicious: '{label}' never flushed for its budget in {workload}.")
        dur = summary[(workload, "durable")][0]
        for variant in VARIANTS[1:]:
            if summary[(workload, variant[0])][0] < dur:
                notes.append(f"Suspicious: '{variant[0]}' ran slower than durable commits in {workload}.")
    if rounds < 2:
        notes.append("One round: every ratio is a single measurement, no interval, and no variant is flagged "
                     "as faster than unbounded.")

    settings = [dict(variant=v[0], mode=v[1], track_lost_commits=v[2], max_loss_bytes=v[3], max_loss_time=v[4])
                for v in VARIANTS]
    return dict(title="7. Loss budget: throughput between durable and delayed",
                columns=["workload", "variant", "commits_per_second", "ratio_to_unbounded", "ratio_interval",
                         "budget_flushes_per_commit", "wal_flushes_per_commit", "wal_bytes_per_commit", "commits"],
                rows=rows, notes=notes,
                extra_tables=[("Variants", ["variant", "mode", "track_lost_commits", "max_loss_bytes",
                                            "max_loss_time"], settings)],
                per_round={f"{w} / {v}": rs for (w, v), rs in runs.items()},
                chart=("module", "exp_loss_budget"))


def draw_chart(result, path):
    """Throughput (median ratio to unbounded delayed commits, log scale,
    with its interval) against the byte and the time budget: durable at
    the left, unbounded at the right."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    by = {(r["workload"], r["variant"]): r for r in result["rows"]}

    def interval(row):
        text = row["ratio_interval"]
        if not text[:1].isdigit():  # "baseline", "n/a (1 round)"
            return None
        lo, hi = text.split(" ")[0].split("-")
        return float(lo), float(hi)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, axis, name in ((axes[0], "bytes", "delayed_durability.max_loss_bytes"),
                           (axes[1], "time", "delayed_durability.max_loss_time")):
        points = [("durable", "durable\n(no loss)")]
        points += [(v[0], v[5][1]) for v in VARIANTS if v[5] and v[5][0] == axis]
        points += [(RING_ON, "unbounded")]
        xs = list(range(len(points)))
        for n, (workload, color) in enumerate(zip(WORKLOADS, ("#4477aa", "#cc6677", "#228833"))):
            ys, lows, highs = [], [], []
            for label, _ in points:
                row = by[(workload, label)]
                y = float(row["ratio_to_unbounded"])
                iv = interval(row) or (y, y)
                ys.append(y)
                lows.append(max(y - iv[0], 0))
                highs.append(max(iv[1] - y, 0))
            shifted = [x + (n - 1) * 0.06 for x in xs]  # so that the interval bars do not hide each other
            ax.errorbar(shifted, ys, yerr=[lows, highs], marker="o", capsize=3, color=color, label=workload)
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.axhline(0.9, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xticks(xs, [p[1] for p in points])
        ax.set_yscale("log")
        ax.set_xlabel(f"{name} (ring on)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(f"throughput / '{BASELINE}'\n(median of per-round ratios)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(result["title"] + "\n(dotted: unbounded, ring off = 1; dashed: 0.9; bars: order-statistic interval)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
