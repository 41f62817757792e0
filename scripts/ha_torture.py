#!/usr/bin/env python3
"""Failover soak under Patroni: three PostgreSQL nodes and etcd on 127.0.0.1,
clients committing delayed, durable and durable-class transactions with
their receipts, the leader killed (kill -9 of Patroni and of every server
process) again and again; every second time (--power-cut-every) its machine
loses power as well. After each failover, on the new leader, with the
clients stopped:

- no acknowledged durable or durable-class commit is missing (Patroni's
  synchronous_mode: the new leader is the synchronous standby);
- the old leader comes back; its crash recovery (run by Patroni before
  pg_rewind) saves its record of acknowledged commits in
  crash_record_directory, nobody copying it; streaming again, the old
  leader delivers that record to the new leader by itself (as the role
  `replicator` of its primary_conninfo, granted EXECUTE on the receiving
  function), and the list the new leader then gives contains
  every acknowledged delayed commit whose row is missing (by xid and commit
  position), no commit whose row is present, and at most one commit per
  client that the client never heard acknowledged (the one in flight);
- every receipt the clients kept reads `durable` when its row is present
  and `lost` when not.

A power cut of the old leader's machine is simulated on its record of
acknowledged commits, which lives in the page cache (it is not on
persistent memory): the record's header gets another machine's boot id (a
restart changes it), and each page of its entries is, at random, as if
never written back (its entries zeroed). The saved record is then marked
as not surviving the restart, and the list the new leader gives must say it
is not exact: every missing acknowledged delayed commit must still be
listed unless the cut zeroed its entry, and nothing listed may be present.
The old leader's WAL is left as written: what it held past the switch
point is discarded by pg_rewind whatever the cut kept, and the durable
commits are judged on the new leader (the cut of unsynced WAL itself is
modelled with strace in t/027, t/029 and t/033). So the old leader
always has WAL past the switch point, and Patroni always runs its crash
recovery in single-user mode and pg_rewind; after a real cut its WAL can
end at the switch point and Patroni starts it as a replica at once, where
the record is saved by the standby's start instead (t/026 and t/035 cover
that start).

The rows on the new leader are the evidence; the report is what is judged.
Run by scripts/ha_torture.sh (as root): it installs Patroni and etcd and
builds the extension first.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import psycopg2

ETCD_CLIENT, ETCD_PEER = 2479, 2480
NODES = [("n1", 5541, 8201), ("n2", 5542, 8202), ("n3", 5543, 8203)]
KINDS = [("delayed", 6), ("durable", 2), ("classed", 2)]
# The record's layout (src/loss/ring.rs): capacity at 12, the writer's boot
# id at 32 (40 bytes), then 64-byte entries filling the file's end, each a
# sequence word (0: never written), commit end, acknowledgement time, full
# xid, database.
RECORD_CAPACITY_AT, BOOT_ID_AT, BOOT_ID_LEN, ENTRY_LEN, WRITING = 12, 32, 40, 64, 2**64 - 1
PAGE = os.sysconf("SC_PAGE_SIZE")

passed = failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok - {what}", flush=True)
    else:
        failed += 1
        print(f"not ok - {what}" + (f": {detail}" if detail else ""), flush=True)


def as_postgres(cmd):
    return ["runuser", "-u", "postgres", "--"] + cmd


class Cluster:
    def __init__(self, work, bindir):
        self.work, self.bindir = work, bindir
        self.procs = {}  # name -> Popen of Patroni (own session)
        self.etcd = None

    def patroni_config(self, name, port, rest):
        data = f"{self.work}/{name}"
        return f"""scope: ddsoak
namespace: /ddsoak/
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{ETCD_CLIENT}
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 2
    retry_timeout: 5
    maximum_lag_on_failover: 1073741824
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        shared_preload_libraries: delayed_durability
        wal_log_hints: 'on'
        wal_level: replica
        hot_standby: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 512MB
        fsync: 'on'
        delayed_durability.lost_commits_ring_size: 262144
  initdb:
  - encoding: UTF8
  - data-checksums
postgresql:
  listen: 127.0.0.1:{port}
  connect_address: 127.0.0.1:{port}
  data_dir: {data}
  bin_dir: {self.bindir}
  pgpass: {self.work}/pgpass_{name}
  authentication:
    superuser:
      username: postgres
      password: soak
    replication:
      username: replicator
      password: soak
    rewind:
      username: postgres
      password: soak
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: '{self.work}'
    delayed_durability.crash_record_directory: '{self.saved_dir(name)}'
"""

    def saved_dir(self, name):
        return f"{self.work}/saved_{name}"

    def start_etcd(self):
        log = open(f"{self.work}/etcd.log", "w")
        self.etcd = subprocess.Popen(as_postgres([
            "etcd", "--name", "soak", "--data-dir", f"{self.work}/etcd",
            "--listen-client-urls", f"http://127.0.0.1:{ETCD_CLIENT}",
            "--advertise-client-urls", f"http://127.0.0.1:{ETCD_CLIENT}",
            "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PEER}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PEER}",
            "--initial-cluster", f"soak=http://127.0.0.1:{ETCD_PEER}"]),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: http_status(f"http://127.0.0.1:{ETCD_CLIENT}/health") == 200, 60, "etcd")

    def start_node(self, name):
        port, rest = node_ports(name)
        path = f"{self.work}/{name}.yml"
        if not os.path.exists(self.saved_dir(name)):
            os.mkdir(self.saved_dir(name))
            shutil.chown(self.saved_dir(name), "postgres")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(self.patroni_config(name, port, rest))
            shutil.chown(path, "postgres")
        log = open(f"{self.work}/{name}.log", "a")
        self.procs[name] = subprocess.Popen(as_postgres(["patroni", path]), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def kill_node(self, name):
        """kill -9 of Patroni and of every server process of the node."""
        p = self.procs.pop(name, None)
        if p:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        pm = postmaster_pid(f"{self.work}/{name}")
        if pm:
            kids = subprocess.run(["pgrep", "-P", str(pm)], capture_output=True, text=True).stdout.split()
            for pid in [pm] + [int(k) for k in kids]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            wait_for(lambda: not alive(pm), 30, f"{name}'s postmaster to die")

    def stop_all(self):
        for name in list(self.procs):
            self.kill_node(name)
        for name, _, _ in NODES:
            pm = postmaster_pid(f"{self.work}/{name}")
            if pm and alive(pm):
                os.kill(pm, signal.SIGKILL)
        if self.etcd:
            try:
                os.killpg(self.etcd.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.etcd.wait()


def power_cut_record(data, rng):
    """The old leader's machine lost power: its record of acknowledged
    commits (in the page cache) comes back with another boot id in its
    header and, page by page at random, with its entries as never written
    back. Returns the full xids of the acknowledged commits whose entries
    were zeroed, and how many pages."""
    path = f"{data}/delayed_durability/commits"
    with open(path, "r+b") as f:
        record = bytearray(f.read())
        capacity = int.from_bytes(record[RECORD_CAPACITY_AT:RECORD_CAPACITY_AT + 4], "little")
        entries_at = len(record) - ENTRY_LEN * capacity
        if entries_at <= BOOT_ID_AT + BOOT_ID_LEN:
            raise RuntimeError(f"{path}: not a record ({len(record)} bytes, capacity {capacity})")
        record[BOOT_ID_AT:BOOT_ID_AT + BOOT_ID_LEN] = b"another-boot-".ljust(BOOT_ID_LEN, b"0")
        # Each page of entries is lost or kept at random, the one holding
        # the newest entries too: some cuts keep the commits a failover
        # loses, which must then be listed, some lose them. (An entry
        # being written, WRITING, was never acknowledged.) The header's
        # own page keeps its live values (the claim counter, covers_from):
        # the mark the copy gets at the restart decides the row first.
        zeroed, pages = set(), 0
        for page_start in range(entries_at // PAGE * PAGE, len(record), PAGE):
            start, end = max(page_start, entries_at), min(page_start + PAGE, len(record))
            if not any(record[start:end]) or rng.random() < 0.5:
                continue
            for at in range(start, end, ENTRY_LEN):
                if int.from_bytes(record[at:at + 8], "little") not in (0, WRITING):
                    zeroed.add(str(int.from_bytes(record[at + 24:at + 32], "little")))
            record[start:end] = bytes(end - start)
            pages += 1
        f.seek(0)
        f.write(record)
        f.flush()
        os.fsync(f.fileno())
    return zeroed, pages


def node_ports(name):
    return next((p, r) for n, p, r in NODES if n == name)


def postmaster_pid(data):
    try:
        with open(f"{data}/postmaster.pid") as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return None


def wait_for(cond, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if cond():
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {seconds} s waiting for {what}")


def connect(name, autocommit=True):
    port, _ = node_ports(name)
    c = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=5)
    c.autocommit = autocommit
    return c


def query(name, sql, args=None):
    c = connect(name)
    try:
        with c.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None
    finally:
        c.close()


def leader(candidates):
    for name in candidates:
        _, rest = node_ports(name)
        if http_status(f"http://127.0.0.1:{rest}/primary") == 200:
            try:
                if query(name, "SELECT NOT pg_is_in_recovery()")[0][0]:
                    return name
            except Exception:
                pass
    return None


def dcs_sync_standbys(name):
    """The members Patroni's /sync key names synchronous standbys, as the
    leader `name` shows them: only they may be promoted in synchronous
    mode. (pg_stat_replication shows a standby synchronous a moment
    before Patroni writes that key.)"""
    _, rest = node_ports(name)
    with urllib.request.urlopen(f"http://127.0.0.1:{rest}/cluster", timeout=2) as r:
        members = json.load(r).get("members", [])
    return {m["name"] for m in members if m.get("role") == "sync_standby" and m.get("state") in ("running", "streaming")}


def streaming_replicas(name):
    return query(name, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")[0][0]


class Client(threading.Thread):
    """Commits until its connection fails; keeps what it was acknowledged."""

    def __init__(self, cid, node, seed):
        super().__init__(daemon=True)
        self.cid, self.node, self.rng = cid, node, random.Random(seed)
        self.acked = []  # (key, kind, xid, receipt or None)
        self.in_flight = None
        self.error = None

    def run(self):
        try:
            conn = connect(self.node)
            cur = conn.cursor()
            seq = 0
            while True:
                seq += 1
                key = self.cid * 10**9 + seq
                kind = self.rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
                table = "td" if kind == "classed" else "t"
                self.in_flight = key
                if kind == "durable":
                    cur.execute(f"INSERT INTO {table} (k, kind) VALUES (%s, %s) RETURNING xid::text", (key, kind))
                    xid = cur.fetchone()[0]
                else:
                    cur.execute("BEGIN")
                    cur.execute("SELECT commit_delayed()")
                    cur.execute(f"INSERT INTO {table} (k, kind) VALUES (%s, %s) RETURNING xid::text", (key, kind))
                    xid = cur.fetchone()[0]
                    cur.execute("COMMIT")
                # Acknowledged: the commit returned.
                self.acked.append([key, kind, xid, None])
                self.in_flight = None
                cur.execute("SELECT last_commit_receipt()")
                self.acked[-1][3] = cur.fetchone()[0]
        except Exception as e:  # the leader died
            self.error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def failover_round(cluster, number, rng, clients_n, seconds, totals, power_cut):
    names = [n for n, _, _ in NODES]
    old = leader(names)
    if not old:
        raise RuntimeError("no leader")
    wait_for(lambda: streaming_replicas(old) == 2, 120, f"two streaming replicas of {old}")
    wait_for(lambda: query(old, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")[0][0] == 1,
             60, "a synchronous standby")
    wait_for(lambda: len(dcs_sync_standbys(old)) == 1, 60, "Patroni's /sync key to name the synchronous standby")
    clients = [Client(i + 1 + number * 100, old, rng.random()) for i in range(clients_n)]
    for c in clients:
        c.start()
    time.sleep(seconds * (0.5 + rng.random()))
    saved_before = set(os.listdir(cluster.saved_dir(old)))
    cluster.kill_node(old)
    zeroed = set()
    if power_cut:
        zeroed, pages = power_cut_record(f"{cluster.work}/{old}", rng)
        print(f"# failover {number}: a power cut of {old}'s machine: {pages} pages of its record lost, "
              f"{len(zeroed)} entries", flush=True)
    for c in clients:
        c.join(30)
    others = [n for n in names if n != old]
    wait_for(lambda: leader(others) is not None, 120, "a new leader")
    new = leader(others)
    # The timeline the new leader writes on, from PostgreSQL (the WAL file name).
    new_tli = query(new, "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int")[0][0]
    wait_for(lambda: query(new, "SELECT count(*) FROM delayed_durability_failovers WHERE new_timeline = %s",
                           (new_tli,))[0][0] == 1, 60, "the failover row on the new leader")
    old_tli, = query(new, "SELECT old_timeline FROM delayed_durability_failovers WHERE new_timeline = %s", (new_tli,))[0]
    check(old_tli == new_tli - 1, f"failover {number}: the new leader recorded the failover from timeline {old_tli}")
    print(f"# failover {number}: {old} -> {new}, timeline {old_tli} -> {new_tli}"
          + (" (power cut)" if power_cut else " (kill -9)"), flush=True)

    acked = [a for c in clients for a in c.acked]
    present = {int(k): xid for k, xid in query(new, "SELECT k, xid::text FROM t UNION ALL SELECT k, xid::text FROM td")}
    missing = [a for a in acked if a[0] not in present]
    durable_missing = [a for a in missing if a[1] != "delayed"]
    check(not durable_missing, f"failover {number}: no acknowledged durable commit is missing",
          f"{len(durable_missing)} missing, e.g. {durable_missing[:3]}")

    # The old leader comes back: Patroni runs its crash recovery and
    # pg_rewind, which replaces its delayed_durability/; the crash recovery
    # saved its record in crash_record_directory first. Nobody copies it:
    # streaming again, the old leader delivers it (renamed .delivered), or
    # the new leader refuses it (.refused) when no acknowledged commit in it
    # is past the switch point (it cannot be told from a stale copy).
    cluster.start_node(old)
    saved = []

    def record_saved():
        saved[:] = sorted(n for n in set(os.listdir(cluster.saved_dir(old))) - saved_before
                          if n.endswith((".commits", ".commits.delivered", ".commits.refused")))
        return saved

    wait_for(record_saved, 180, f"{old}'s record saved by its crash recovery")
    # (30 "nothing waits" answers, 10 s apart, before a refusal: wait longer.)
    wait_for(lambda: record_saved() and not saved[0].endswith(".commits"), 420,
             f"{old}'s record delivered to {new} (or refused there)")
    listed = query(new, """SELECT l.xid::text, l.commit_lsn::text FROM delayed_durability_lost_commits l
        JOIN delayed_durability_failovers f ON f.failover_at = l.crash_recovered_at
        WHERE l.lost_in = 'failover' AND f.new_timeline = %s""", (new_tli,))
    exact, lost_n, detail = query(new, """SELECT exact, lost_commits, detail FROM delayed_durability_failovers
        WHERE new_timeline = %s""", (new_tli,))[0]
    if power_cut:
        # A marked record is taken even with nothing past the switch point:
        # it cannot prove it is older than the failover.
        check(saved[0].endswith(".delivered") and not exact and lost_n == len(listed)
              and "did not survive the restart of its machine" in (detail or ""),
              f"failover {number}: after the power cut the delivered record lists {lost_n}, not exact, saying why",
              f"{saved[0]}, exact {exact}, {len(listed)} rows, detail {detail!r}")
    elif saved[0].endswith(".refused"):
        lost_delayed = [a for a in missing if a[1] == "delayed"]
        check(not lost_delayed and lost_n is None, f"failover {number}: the new leader refuses a delivered record with "
              "nothing past the switch point, and no acknowledged delayed commit is missing",
              f"{len(lost_delayed)} missing, lost_commits {lost_n}")
        totals["refused_nothing_lost"] += 1
    else:
        check(exact and lost_n == len(listed), f"failover {number}: the delivered record lists {lost_n}, exactly",
              f"exact {exact}, {len(listed)} rows")
    listed_set = set(listed)
    listed_xids = {x for x, _ in listed}
    unlisted = [a for a in missing if a[1] == "delayed" and
                not (a[3] and (a[2], a[3].split(":")[2]) in listed_set) and not (a[3] is None and a[2] in listed_xids)]
    # After a power cut, only those whose entry it zeroed may be unlisted.
    unlisted_cut = [a for a in unlisted if a[2] in zeroed]
    unlisted = [a for a in unlisted if a[2] not in zeroed]
    check(not unlisted, f"failover {number}: every acknowledged delayed commit that is missing is listed"
          + (f" ({len(unlisted_cut)} whose entries the power cut zeroed are not)" if power_cut else ""),
          f"{len(unlisted)} not listed, e.g. {unlisted[:3]}")
    present_xids = set(present.values())
    false_reports = [x for x, _ in listed if x in present_xids]
    check(not false_reports, f"failover {number}: no listed commit is present", f"{false_reports[:5]}")
    acked_xids = {a[2] for a in acked}
    never_acked = [x for x, _ in listed if x not in acked_xids]
    check(len(never_acked) <= clients_n, f"failover {number}: listed but never acknowledged: {len(never_acked)}, "
          f"at most one in flight per client ({clients_n})")

    receipts = [a for a in acked if a[3]]
    statuses = dict(query(new, "SELECT r, (receipt_status(r)).status FROM unnest(%s::text[]) AS r",
                          ([a[3] for a in receipts],)))
    wrong = [(a[0], a[1], statuses[a[3]]) for a in receipts
             if statuses[a[3]] != ("durable" if a[0] in present else "lost")]
    check(not wrong, f"failover {number}: each of {len(receipts)} receipts reads durable when its row is present, "
          f"lost when not", f"{len(wrong)} wrong, e.g. {wrong[:3]}")

    totals["failovers"] += 1
    totals["power_cuts"] += 1 if power_cut else 0
    totals["lost_unlisted_power_cut"] += len(unlisted_cut)
    totals["lost_listed_power_cut"] += len(listed) if power_cut else 0
    totals["acked_delayed"] += sum(1 for a in acked if a[1] == "delayed")
    totals["acked_durable"] += sum(1 for a in acked if a[1] != "delayed")
    totals["lost"] += len(missing)
    totals["lost_delayed_acked"] += sum(1 for a in missing if a[1] == "delayed")
    totals["listed"] += len(listed)
    totals["durable_lost"] += len(durable_missing)

    # The old leader rejoins as a replica; its crash recovery saved one
    # record, and its start after pg_rewind none (that record is the new
    # leader's).
    wait_for(lambda: streaming_replicas(new) == 2, 240, f"{old} to rejoin {new}")
    record_saved()
    check(len(saved) == 1, f"failover {number}: {old} saved its record once", f"{saved}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--failovers", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--power-cut-every", type=int, default=2,
                    help="every Nth failover follows a power cut of the leader's machine (0: never)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    print(f"# seed {seed}", flush=True)
    rng = random.Random(seed)
    cluster = Cluster(args.work, args.bindir)
    totals = dict.fromkeys(["failovers", "acked_delayed", "acked_durable", "lost", "lost_delayed_acked", "listed",
                            "durable_lost", "refused_nothing_lost", "power_cuts",
                            "lost_listed_power_cut", "lost_unlisted_power_cut"], 0)
    started = time.time()
    try:
        cluster.start_etcd()
        cluster.start_node("n1")
        wait_for(lambda: leader(["n1"]) == "n1", 120, "n1 to bootstrap")
        query("n1", """CREATE EXTENSION delayed_durability;
            ALTER DATABASE postgres SET delayed_durability.mode = 'allowed';
            CREATE TABLE t (k bigint PRIMARY KEY, kind text NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id());
            CREATE TABLE td (LIKE t INCLUDING ALL);
            SELECT delayed_durability_set_table_class('td', 'durable');
            -- The role a rejoined old leader delivers its record as (its primary_conninfo's).
            GRANT EXECUTE ON FUNCTION delayed_durability_receive_failover_record(bytea, text, integer) TO replicator;""")
        cluster.start_node("n2")
        cluster.start_node("n3")
        for i in range(1, args.failovers + 1):
            power_cut = args.power_cut_every > 0 and i % args.power_cut_every == 0
            failover_round(cluster, i, rng, args.clients, args.seconds, totals, power_cut)
    except Exception as e:
        check(False, "the soak ran to its end", str(e))
    finally:
        cluster.stop_all()
    print("# totals: " + json.dumps(totals), flush=True)
    print(f"# {time.time() - started:.0f} s", flush=True)
    print(f"ha_torture: {passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed or not passed else 0)


if __name__ == "__main__":
    main()
