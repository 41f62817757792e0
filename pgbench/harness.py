"""Throwaway PostgreSQL clusters for the experiments and benchmarks.

Runs as root and starts every server as the postgres user (PostgreSQL
refuses root), in a directory that user owns. Nothing here depends on a
Python package outside the standard library.
"""
import os
import shutil
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Objects the experiments use (pgbench/setup.sql).
SETUP_SQL = open(os.path.join(HERE, "setup.sql")).read()

# The server's binaries: run.sh exports PGBIN for the version it built for
# (--pg N); Debian's PostgreSQL 15 otherwise.
PGBIN = os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin")


class Unavailable(Exception):
    """An experiment whose feature is not in this build (run.py skips it)."""


BASE_CONF = """
listen_addresses = ''
fsync = on
synchronous_commit = on
max_connections = 50
shared_buffers = 256MB
max_wal_size = 4GB
checkpoint_timeout = 30min
autovacuum = off
max_prepared_transactions = 10
"""


def postgres_command(args):
    """(args, env) to run a command as the postgres user. PGAPPNAME is
    dropped: the experiments find their sessions by application_name (the
    TAP framework sets PGAPPNAME to the test's name)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUST_") and k != "PGAPPNAME"}
    if os.geteuid() == 0:
        args = ["runuser", "-u", "postgres", "--"] + list(args)
    return list(args), env


def as_postgres(args, **kw):
    args, env = postgres_command(args)
    return subprocess.run(args, env=env, **kw)


class Cluster:
    """One initdb'ed, started cluster; stop() removes it."""

    def __init__(self, name, port, preload=True, conf="", wal_segsize_mb=None, root=None, server_env=None):
        self.name = name
        self.port = port
        # Environment of the server processes (e.g. PMEM_IS_PMEM_FORCE=1).
        self.server_env = [f"{k}={v}" for k, v in (server_env or {}).items()]
        self.dir = tempfile.mkdtemp(prefix=f"dd-{name}-", dir=root or "/tmp")
        os.chmod(self.dir, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        self.data = os.path.join(self.dir, "data")
        initdb = [f"{PGBIN}/initdb", "-D", self.data, "--auth=trust", "--no-sync", "-U", "postgres"]
        if wal_segsize_mb:
            initdb.append(f"--wal-segsize={wal_segsize_mb}")
        as_postgres(initdb, check=True, stdout=subprocess.DEVNULL)
        extra = BASE_CONF + f"port = {port}\nunix_socket_directories = '{self.dir}'\n"
        if preload:
            extra += "shared_preload_libraries = 'delayed_durability'\n"
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(extra + conf + "\n")
        self.start()
        self.version_num = int(self.value("SHOW server_version_num"))

    def start(self):
        as_postgres(["env"] + self.server_env + [f"{PGBIN}/pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "log"), "-w", "start"],
                    check=True, stdout=subprocess.DEVNULL)

    def restart(self):
        as_postgres([f"{PGBIN}/pg_ctl", "-D", self.data, "-w", "-m", "fast", "restart"],
                    check=True, stdout=subprocess.DEVNULL)

    def restart_with(self, preload):
        """Restarts with or without the library preloaded (the setting in
        postgresql.conf is overridden on the command line)."""
        libs = "delayed_durability" if preload else "''"
        as_postgres([f"{PGBIN}/pg_ctl", "-D", self.data, "-w", "-m", "fast", "restart", "-o",
                     f"-c shared_preload_libraries={libs}"], check=True, stdout=subprocess.DEVNULL)

    def stop(self, remove=True):
        as_postgres([f"{PGBIN}/pg_ctl", "-D", self.data, "-w", "-m", "fast", "stop"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    def psql(self, sql, db="postgres"):
        """Runs a script (statements separated as psql does) and returns
        the unaligned, tuples-only output lines."""
        r = as_postgres([f"{PGBIN}/psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-h", self.dir, "-p",
                         str(self.port), "-d", db, "-f", "-"],
                        input=sql, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed on {self.name}: {r.stderr.strip()}\n--- script ---\n{sql[:2000]}")
        return [line for line in r.stdout.splitlines() if line != ""]

    def value(self, sql, db="postgres"):
        return self.psql(sql, db)[-1]

    def pgbench(self, script_path, clients, seconds=None, transactions=None, db="postgres", defines=()):
        """Runs pgbench and returns (tps, transactions processed)."""
        args = [f"{PGBIN}/pgbench", "-n", "-h", self.dir, "-p", str(self.port), "-c", str(clients),
                "-j", str(min(clients, 2)), "-f", script_path]
        args += ["-T", str(seconds)] if seconds else ["-t", str(transactions)]
        for d in defines:
            args += ["-D", d]
        args.append(db)
        r = as_postgres(args, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"pgbench failed: {r.stderr.strip()}")
        tps = processed = None
        for line in r.stdout.splitlines():
            if line.startswith("tps =") and tps is None:
                tps = float(line.split()[2])
            if "number of transactions actually processed" in line:
                processed = int(line.split(":")[1].split("/")[0])
        return tps, processed


# Measures one piece of work: server clock around it only, and PostgreSQL's
# own WAL counters as deltas: fsyncs (pg_stat_wal.wal_sync, pg_stat_io from
# 18, read by delayed_durability_wal_fsyncs()), writes (pg_stat_wal.wal_write;
# pg_stat_io's writes of object 'wal' from 18), records and bytes
# (pg_stat_wal.wal_records, wal_bytes). SQL Server's Log Flushes/sec counts
# log-block writes (each one write-through), so the writes are the figure to
# set beside the articles' flush counts; the fsyncs are what a commit waits
# for. Statistics are forced out before reading (backends publish them when
# idle, pg_stat_force_next_flush() makes the next idle moment publish at
# once), and all in one session so the working backend's own I/O is counted.
MEASURE_TEMPLATE = """
{setup}
SELECT pg_stat_force_next_flush();
SELECT {counters} AS c0 \\gset
SELECT clock_timestamp() AS t0 \\gset
{work}
SELECT extract(epoch FROM clock_timestamp() - :'t0') AS secs \\gset
SELECT pg_stat_force_next_flush();
SELECT 'result ' || :secs || ' ' || {counters};
SELECT 'before ' || :'c0';
"""
# The counters in the order measure_wal() reports them.
WAL_COUNTERS = ("fsyncs", "writes", "records", "bytes")


def wal_counters_sql(cluster):
    """One SQL expression giving 'fsyncs writes records bytes'."""
    writes = ("(SELECT sum(writes)::bigint FROM pg_catalog.pg_stat_io WHERE object = 'wal' AND context = 'normal')"
              if cluster.version_num >= 180000 else "(SELECT wal_write FROM pg_catalog.pg_stat_wal)")
    # coalesce: a NULL would silently shift the fields that follow it.
    return (f"concat_ws(' ', coalesce(delayed_durability_wal_fsyncs(), 0), coalesce({writes}, 0), "
            "coalesce((SELECT wal_records FROM pg_catalog.pg_stat_wal), 0), "
            "coalesce((SELECT wal_bytes::bigint FROM pg_catalog.pg_stat_wal), 0))")


def measure_wal(cluster, work, setup="", db="postgres"):
    """Returns dict(seconds=..., fsyncs=..., writes=..., records=..., bytes=...)
    for the SQL in `work` (counts are deltas)."""
    out = cluster.psql(MEASURE_TEMPLATE.format(setup=setup, work=work, counters=wal_counters_sql(cluster)), db)
    result = out[-2].split()
    before = out[-1].split()[1:]
    after = result[2:]
    r = dict(seconds=float(result[1]))
    for name, a, b in zip(WAL_COUNTERS, after, before):
        r[name] = int(a) - int(b)
    return r


def measure(cluster, work, setup="", db="postgres"):
    """Returns (seconds, wal_fsyncs) for the SQL in `work`."""
    r = measure_wal(cluster, work, setup, db)
    return r["seconds"], r["fsyncs"]


def wal_sync_total(cluster):
    return int(cluster.value("SELECT pg_stat_force_next_flush();\nSELECT delayed_durability_wal_fsyncs();"))


def wal_write_total(cluster):
    """PostgreSQL's count of WAL writes (see MEASURE_TEMPLATE)."""
    return int(cluster.value("SELECT pg_stat_force_next_flush();\nSELECT " + wal_counters_sql(cluster)).split()[1])


class Progress:
    """Prints which step runs and the elapsed time, for long runs."""

    def __init__(self):
        self.start = time.monotonic()

    def __call__(self, msg):
        print(f"[{time.monotonic() - self.start:7.1f}s] {msg}", flush=True)


def has_function(cluster, name):
    return cluster.value(f"SELECT count(*) FROM pg_proc WHERE proname = '{name}'") != "0"
