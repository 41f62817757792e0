-- Durability receipts, the loss budget's settings and the crash report's
-- SQL interface (crashes themselves are in t/021 and t/022).
CREATE EXTENSION IF NOT EXISTS delayed_durability;
CREATE TABLE r (id int);
SET delayed_durability.mode = 'forced';

-- Signatures.
SELECT p.oid::regprocedure AS function, pg_get_function_result(p.oid) AS result,
       p.proisstrict AS strict, p.provolatile AS volatility, p.proparallel AS parallel
  FROM pg_proc AS p
 WHERE p.proname IN ('last_commit_lsn', 'is_durable', 'wait_durable', 'delayed_durability_lost_commits_reset',
                     'last_commit_receipt', 'receipt_status', 'delayed_durability_import_failover_record',
                     'delayed_durability_receive_failover_record')
 ORDER BY p.oid::regprocedure::text;
SELECT pg_get_function_arguments('wait_durable'::regproc);

-- A fresh session has no receipt; a commit gives one.
\c
SET delayed_durability.mode = 'forced';
SELECT last_commit_lsn() IS NULL AS no_receipt_yet;
INSERT INTO r VALUES (1);
SELECT last_commit_lsn() AS receipt \gset
SELECT :'receipt'::pg_lsn > '0/0' AS has_receipt,
       :'receipt'::pg_lsn <= pg_current_wal_insert_lsn() AS not_beyond_insert,
       is_durable(:'receipt') AS durable_after_delayed_commit;
SELECT flush_log() >= :'receipt'::pg_lsn AS flushed;
SELECT is_durable(:'receipt') AS durable_after_flush_log,
       wait_durable(:'receipt') AS wait_returns_at_once,
       wait_durable(:'receipt', interval '0') AS even_without_time;

-- pg_current_wal_insert_lsn() right after a segment switch points past the
-- next page header: accepted, and it means the boundary.
INSERT INTO r VALUES (10);
SELECT pg_switch_wal() IS NOT NULL AS switched;
SELECT pg_current_wal_insert_lsn() AS at_boundary \gset
SELECT flush_log() IS NOT NULL AS flushed;
SELECT is_durable(:'at_boundary') AS boundary_durable,
       wait_durable(:'at_boundary', interval '1s') AS boundary_waited;
-- A position inside that page header stands for the boundary too: no WAL
-- byte lies before it in the segment. Right after the switch (nothing
-- flushed since, nothing for the WAL writer to do) it reads durable, and
-- the wait returns at once instead of sleeping to its timeout.
SELECT pg_switch_wal() IS NOT NULL AS switched_again;
SELECT (pg_current_wal_insert_lsn() - (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)
          % pg_size_bytes(current_setting('wal_segment_size'))) AS segment_start \gset
SELECT is_durable(:'segment_start'::pg_lsn + 1) AS inside_header_plus_1,
       is_durable(:'segment_start'::pg_lsn + 16) AS inside_header_plus_16,
       wait_durable(:'segment_start'::pg_lsn + 16, interval '5s') AS inside_header_waited;

-- NULL in, NULL out; invalid and future positions are errors with a hint.
SELECT is_durable(NULL) IS NULL AS null_is_durable, wait_durable(NULL) IS NULL AS null_wait;
SELECT wait_durable(:'receipt', NULL) AS null_timeout_waits_without_limit;
SELECT is_durable('0/0');
SELECT wait_durable('0/0');
-- (The insert position in the message varies: masked.)
DO $$
BEGIN
    PERFORM is_durable('FFFFFFFF/0');
EXCEPTION WHEN invalid_parameter_value THEN
    RAISE NOTICE '%', regexp_replace(SQLERRM, 'position [0-9A-F]+/[0-9A-F]+$', 'position X/X');
END $$;
DO $$
BEGIN
    PERFORM wait_durable('FFFFFFFF/0', interval '1s');
EXCEPTION WHEN invalid_parameter_value THEN
    RAISE NOTICE '%', regexp_replace(SQLERRM, 'position [0-9A-F]+/[0-9A-F]+$', 'position X/X');
END $$;
\set VERBOSITY default
SELECT wait_durable(:'receipt', interval '-1s');

-- The budget's settings: bytes and milliseconds, 0 by default, bounded.
SELECT name, setting, unit, context, min_val, max_val FROM pg_settings
 WHERE name IN ('delayed_durability.max_loss_bytes', 'delayed_durability.max_loss_time',
                'delayed_durability.track_lost_commits', 'delayed_durability.lost_commits_ring_size')
 ORDER BY name;
SET delayed_durability.max_loss_bytes = '64kB';
SHOW delayed_durability.max_loss_bytes;
SET delayed_durability.max_loss_time = '10ms';
SHOW delayed_durability.max_loss_time;
-- Only the SQLSTATE: PostgreSQL 18 prints the range with units (0 B .. 2147483647 B).
\set VERBOSITY sqlstate
SET delayed_durability.max_loss_bytes = -1;
\set VERBOSITY default
SET delayed_durability.max_loss_time = '1 fortnight';
RESET delayed_durability.max_loss_bytes;
RESET delayed_durability.max_loss_time;
SET delayed_durability.track_lost_commits = off;

-- The counter and the status column.
SELECT commits_budget_flushed >= 0 AS has_budget_counter FROM delayed_durability_stats WHERE datname = current_database();
SELECT pg_typeof(oldest_unflushed_commit_age) FROM delayed_durability_status();
SELECT flush_log() IS NOT NULL AS flushed;
SELECT oldest_unflushed_commit_age IS NULL AS nothing_unflushed FROM delayed_durability_status();
-- A byte budget smaller than any commit flushes every delayed commit.
SELECT commits_budget_flushed AS budget_before FROM delayed_durability_stats WHERE datname = current_database() \gset
SET delayed_durability.max_loss_bytes = 1;
INSERT INTO r VALUES (2);
SELECT is_durable(last_commit_lsn()) AS budget_made_it_durable;
SELECT commits_budget_flushed - :budget_before AS budget_flushes
  FROM delayed_durability_stats WHERE datname = current_database();
RESET delayed_durability.max_loss_bytes;

-- The crash report: empty on a server that never crashed; reading it
-- assigns no transaction id.
BEGIN;
SELECT count(*) AS crashes FROM delayed_durability_crashes;
SELECT count(*) AS lost FROM delayed_durability_lost_commits;
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = 'delayed_durability_lost_commits'::regclass AND attnum > 0 ORDER BY attnum;
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = 'delayed_durability_crashes'::regclass AND attnum > 0 ORDER BY attnum;

-- Privileges: receipts for everyone; the report for superusers and roles
-- granted SELECT; reset for superusers.
CREATE ROLE dd_receipt_user;
GRANT INSERT ON r TO dd_receipt_user;
SET ROLE dd_receipt_user;
INSERT INTO r VALUES (3);
SELECT last_commit_lsn() IS NOT NULL AS user_has_receipt, is_durable(last_commit_lsn()) IS NOT NULL AS user_can_check;
SELECT count(*) FROM delayed_durability_lost_commits;
SELECT count(*) FROM delayed_durability_crash_rows();
SELECT delayed_durability_lost_commits_reset();
SET delayed_durability.max_loss_bytes = '1MB';
RESET ROLE;
GRANT SELECT ON delayed_durability_crashes TO dd_receipt_user;
SET ROLE dd_receipt_user;
SELECT count(*) AS granted FROM delayed_durability_crashes;
RESET ROLE;
REVOKE SELECT ON delayed_durability_crashes FROM dd_receipt_user;
DROP OWNED BY dd_receipt_user;
DROP ROLE dd_receipt_user;
SELECT delayed_durability_lost_commits_reset();
DROP TABLE r;

-- pg_monitor reads the crash report, as it reads PostgreSQL's own
-- monitoring views.
CREATE ROLE regress_dd_monitor IN ROLE pg_monitor;
SET ROLE regress_dd_monitor;
SELECT count(*) >= 0 AS monitor_reads_crashes FROM delayed_durability_crashes;
SELECT count(*) >= 0 AS monitor_reads_lost_commits FROM delayed_durability_lost_commits;
RESET ROLE;
DROP ROLE regress_dd_monitor;

-- A receipt across crashes and promotions: system, timeline, commit end,
-- xid, commit time. Here (no failover, no crash since) durable once flushed.
CREATE TABLE r2 (id int);
INSERT INTO r2 VALUES (20);
SELECT split_part(last_commit_receipt(), ':', 2) AS timeline,
       split_part(last_commit_receipt(), ':', 3)::pg_lsn = last_commit_lsn() AS names_the_commit_end,
       (receipt_status(last_commit_receipt())).status AS before_flush;
SELECT flush_log() IS NOT NULL AS flushed;
SELECT (receipt_status(last_commit_receipt())).status AS after_flush;
-- A timeline this server does not descend from, malformed receipts.
SELECT (receipt_status(regexp_replace(last_commit_receipt(), '^(\d+):\d+:', '\1:7:'))).*;
SELECT * FROM receipt_status('1:2:3');
DO $$ BEGIN
  PERFORM * FROM receipt_status(regexp_replace(last_commit_receipt(), '^\d+', '42'));
EXCEPTION WHEN invalid_parameter_value THEN RAISE NOTICE 'a receipt of another system: refused (%)', SQLSTATE;
END $$;
DROP TABLE r2;
