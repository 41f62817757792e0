"""Instructions per commit (or per call) of one backend, counted by
valgrind's callgrind: the deterministic cost measure next to the wall clock.

Hardware instruction counters are not available in this VM, and CPU time
swings with the other core's load; callgrind counts every user-space
instruction a process executes, whatever the load. The postmaster runs under
callgrind, so every server process it forks is counted in a file of its own
(cg.<pid>); a session's backend is found by its pid. Startup costs cancel
out: the same work runs at two sizes, in two sessions, and the difference is
divided by the difference in size. Kernel time (fsync, kill, page faults) is
not counted: that is what the wall clock is for.
"""
import os
import re
import shutil
import subprocess
import tempfile
import time

from harness import PGBIN, as_postgres


def available():
    return shutil.which("valgrind") is not None


class CallgrindServer:
    """The cluster's server, started under callgrind with the library
    preloaded or not and the given settings (as -c options, which win over
    postgresql.conf and ALTER SYSTEM); the cluster is started normally again
    on exit."""

    def __init__(self, cluster, preload, settings):
        self.cl = cluster
        self.preload = preload
        self.settings = settings
        self.proc = None

    def __enter__(self):
        self.cl.stop(remove=False)
        self.out = tempfile.mkdtemp(prefix="dd-callgrind-", dir=self.cl.dir)
        if os.geteuid() == 0:
            shutil.chown(self.out, "postgres")
        options = ["-c", "shared_preload_libraries=" + ("delayed_durability" if self.preload else "")]
        for k, v in self.settings.items():
            options += ["-c", f"{k}={v}"]
        args = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}/cg.%p",
                f"{PGBIN}/postgres", "-D", self.cl.data] + options
        env_args = ["env"] + self.cl.server_env
        if os.geteuid() == 0:
            env_args = ["runuser", "-u", "postgres", "--"] + env_args
        self.proc = subprocess.Popen(env_args + args, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.cl.dir, "callgrind.log"), "a"))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            r = as_postgres([f"{PGBIN}/pg_isready", "-q", "-h", self.cl.dir, "-p", str(self.cl.port)])
            if r.returncode == 0:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"server under callgrind did not start (see {self.cl.dir}/callgrind.log)")

    def __exit__(self, *exc):
        as_postgres([f"{PGBIN}/pg_ctl", "-D", self.cl.data, "-w", "-m", "fast", "stop"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.proc.wait(timeout=300)
        self.total = 0
        for name in os.listdir(self.out):
            with open(os.path.join(self.out, name)) as f:
                m = re.search(r"^summary:\s+(\d+)", f.read(), re.M)
            self.total += int(m.group(1)) if m else 0
        shutil.rmtree(self.out, ignore_errors=True)
        self.cl.start()

    def session(self, sql):
        """Runs `sql` in a new session; returns the instructions its backend
        executed in all (the file is written when the backend exits)."""
        lines = self.cl.psql("SELECT 'pid ' || pg_backend_pid();\n" + sql)
        pid = next(line.split()[1] for line in lines if line.startswith("pid "))
        path = os.path.join(self.out, f"cg.{pid}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if os.path.exists(path):
                with open(path) as f:
                    m = re.search(r"^summary:\s+(\d+)", f.read(), re.M)
                if m:
                    return int(m.group(1))
            time.sleep(0.2)
        raise RuntimeError(f"no callgrind summary for backend {pid}")

    # After exit, `total` is what all server processes executed together,
    # from the postmaster's start to its shutdown.

    def per_unit(self, work, small, large):
        """Instructions per unit of `work` (a format string with {n})."""
        return self.per_unit_sql(lambda n: work.format(n=n), small, large)

    def per_unit_sql(self, make_sql, small, large):
        """Instructions per unit of make_sql(n)'s work."""
        a = self.session(make_sql(small))
        b = self.session(make_sql(large))
        return (b - a) / (large - small)


def client_statements(script_text, n):
    """A pgbench script's statements repeated n times, for psql: one client
    round trip per statement, as pgbench makes them."""
    body = [line for line in script_text.splitlines()
            if line.strip() and not line.startswith("--") and not line.startswith("\\")]
    text = "\n".join(body).replace(":id", "1") + "\n"
    return text * n


def all_processes_per_unit(cluster, preload, settings, work, small, large):
    """Instructions per unit of `work` (a format string with {n}) summed
    over every server process (backend, WAL writer, checkpointer...): two
    server runs, start to shutdown, that differ only in the size of the work.
    For comparisons that move work between processes."""
    totals = []
    for n in (small, large):
        with CallgrindServer(cluster, preload, settings) as srv:
            srv.session(work.format(n=n))
        totals.append(srv.total)
    return (totals[1] - totals[0]) / (large - small)
