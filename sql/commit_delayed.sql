-- commit_delayed(), the per-commit decision and the counters that record it.
CREATE EXTENSION IF NOT EXISTS delayed_durability;
CREATE TABLE t (id int);

-- Counters of this database; deltas are taken with \gset.
CREATE FUNCTION counters(OUT durable bigint, OUT delayed bigint, OUT ignored bigint,
                         OUT forced bigint, OUT flushes bigint)
LANGUAGE sql AS $$
  SELECT commits_durable, commits_delayed, delayed_requests_ignored,
         commits_forced_durable, flush_log_calls
    FROM delayed_durability_stats WHERE datname = current_database()
$$;
-- Independent of the counters: is PostgreSQL's WAL flush position at or
-- past the end of inserted WAL? (the insert position stepped back over a
-- page or segment header, as flush_log.sql explains)
CREATE FUNCTION flushed() RETURNS boolean LANGUAGE sql VOLATILE AS $$
  SELECT pg_current_wal_flush_lsn() >= CASE
    WHEN (i - '0/0'::pg_lsn) % pg_size_bytes(current_setting('wal_segment_size')) = 40 THEN i - 40
    WHEN (i - '0/0'::pg_lsn) % 8192 = 24 THEN i - 24
    ELSE i END
  FROM (SELECT pg_current_wal_insert_lsn() AS i) AS s $$;
\set deltas 'SELECT durable - :b_durable AS durable, delayed - :b_delayed AS delayed, ignored - :b_ignored AS ignored, forced - :b_forced AS forced, flushes - :b_flushes AS flushes FROM counters()'

-- disabled: the request is ignored without error, every commit is durable,
-- and synchronous_commit = off is raised to on.
SET delayed_durability.mode = 'disabled';
SELECT * FROM counters() \gset b_
BEGIN;
SELECT commit_delayed();
INSERT INTO t VALUES (1);
COMMIT;
SELECT flushed() AS durable_despite_request;
SET synchronous_commit = off;
INSERT INTO t VALUES (2);
SELECT flushed() AS durable_despite_sync_off;
RESET synchronous_commit;
INSERT INTO t VALUES (3);
:deltas;

-- allowed: plain commits follow synchronous_commit, requests are honoured.
SET delayed_durability.mode = 'allowed';
SELECT * FROM counters() \gset b_
INSERT INTO t VALUES (4);
BEGIN;
SELECT commit_delayed();
INSERT INTO t VALUES (5);
COMMIT;
SET synchronous_commit = off;
INSERT INTO t VALUES (6);
RESET synchronous_commit;
BEGIN;
SET LOCAL synchronous_commit = off;
INSERT INTO t VALUES (7);
COMMIT;
:deltas;

-- forced: every commit is delayed, asked for or not.
SET delayed_durability.mode = 'forced';
SELECT * FROM counters() \gset b_
INSERT INTO t VALUES (8);
BEGIN;
SELECT commit_delayed();
INSERT INTO t VALUES (9);
COMMIT;
SET synchronous_commit = remote_apply;
INSERT INTO t VALUES (10);
RESET synchronous_commit;
:deltas;

-- The policy never changes what the session sees: synchronous_commit is
-- restored after each commit.
SET delayed_durability.mode = 'forced';
INSERT INTO t VALUES (11);
SHOW synchronous_commit;
SET delayed_durability.mode = 'disabled';
SET synchronous_commit = off;
INSERT INTO t VALUES (12);
SHOW synchronous_commit;
RESET synchronous_commit;

-- Read-only transactions write no commit record and are not counted.
SET delayed_durability.mode = 'forced';
SELECT * FROM counters() \gset b_
SELECT count(*) FROM t;
BEGIN; SELECT 1; COMMIT;
:deltas;

-- Outside a transaction block the request has no effect, as SET LOCAL has
-- none there: a WARNING, false, and the statement's commit is not delayed.
SET delayed_durability.mode = 'allowed';
SELECT * FROM counters() \gset b_
SELECT commit_delayed();
INSERT INTO t SELECT 100 WHERE commit_delayed();
:deltas;
SET delayed_durability.mode = 'disabled';
SELECT commit_delayed();

-- The return value follows the mode in effect when it is called.
BEGIN;
SET LOCAL delayed_durability.mode = 'disabled';
SELECT commit_delayed() AS disabled;
SET LOCAL delayed_durability.mode = 'allowed';
SELECT commit_delayed() AS allowed;
SET LOCAL delayed_durability.mode = 'forced';
SELECT commit_delayed() AS forced;
ROLLBACK;

-- The request belongs to the top-level transaction: ROLLBACK TO SAVEPOINT
-- does not cancel it, and it can be made from inside a subtransaction.
SET delayed_durability.mode = 'allowed';
SELECT * FROM counters() \gset b_
BEGIN;
INSERT INTO t VALUES (13);
SAVEPOINT s1;
SELECT commit_delayed();
ROLLBACK TO SAVEPOINT s1;
COMMIT;
BEGIN;
SAVEPOINT s1;
SELECT commit_delayed();
INSERT INTO t VALUES (14);
RELEASE SAVEPOINT s1;
COMMIT;
:deltas;

-- A rolled-back transaction forgets its request: the next one is durable.
SELECT * FROM counters() \gset b_
BEGIN;
SELECT commit_delayed();
INSERT INTO t VALUES (15);
ROLLBACK;
INSERT INTO t VALUES (16);
:deltas;

-- An error aborts the transaction and its request.
BEGIN;
SELECT commit_delayed();
SELECT 1/0;
COMMIT;
SELECT * FROM counters() \gset b_
INSERT INTO t VALUES (17);
:deltas;

-- Procedures that COMMIT in a loop go through the same decision per commit.
CREATE PROCEDURE insert_loop(n int, delayed boolean) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..n LOOP
    IF delayed THEN PERFORM commit_delayed(); END IF;
    INSERT INTO t VALUES (1000 + i);
    COMMIT;
  END LOOP;
END $$;
SET delayed_durability.mode = 'allowed';
SELECT * FROM counters() \gset b_
CALL insert_loop(10, false);
CALL insert_loop(7, true);
:deltas;
SET delayed_durability.mode = 'forced';
SELECT * FROM counters() \gset b_
CALL insert_loop(5, false);
:deltas;
-- A DO block may commit too.
SET delayed_durability.mode = 'allowed';
SELECT * FROM counters() \gset b_
DO $$ BEGIN PERFORM commit_delayed(); INSERT INTO t VALUES (2000); COMMIT; INSERT INTO t VALUES (2001); END $$;
:deltas;

-- PostgreSQL forces some commits durable whatever the policy: two-phase
-- commit and commits that drop relation files. They are counted as durable
-- and as forced durable.
SET delayed_durability.mode = 'forced';
SELECT * FROM counters() \gset b_
BEGIN;
SELECT commit_delayed();
INSERT INTO t VALUES (3000);
PREPARE TRANSACTION 'dd_2pc';
SELECT flushed() AS prepare_durable;
COMMIT PREPARED 'dd_2pc';
SELECT flushed() AS commit_prepared_durable;
BEGIN;
INSERT INTO t VALUES (3001);
PREPARE TRANSACTION 'dd_2pc_rollback';
ROLLBACK PREPARED 'dd_2pc_rollback';
SELECT flushed() AS rollback_prepared_durable;
CREATE TABLE dropped (i int);
DROP TABLE dropped;
SELECT flushed() AS drop_table_durable;
TRUNCATE t;
SELECT flushed() AS truncate_durable;
:deltas;
-- CREATE/DROP DATABASE and TABLESPACE: PostgreSQL forces their commit
-- durable (ForceSyncCommit); the utility hook counts them as forced.
SELECT * FROM counters() \gset b_
CREATE DATABASE dd_forced_db;
SELECT flushed() AS create_database_durable;
DROP DATABASE dd_forced_db;
SELECT flushed() AS drop_database_durable;
SET allow_in_place_tablespaces = on;
CREATE TABLESPACE dd_forced_ts LOCATION '';
SELECT flushed() AS create_tablespace_durable;
DROP TABLESPACE dd_forced_ts;
SELECT flushed() AS drop_tablespace_durable;
RESET allow_in_place_tablespaces;
:deltas;
-- Under disabled they are plain durable commits.
SET delayed_durability.mode = 'disabled';
SELECT * FROM counters() \gset b_
BEGIN;
INSERT INTO t VALUES (3002);
PREPARE TRANSACTION 'dd_2pc';
COMMIT PREPARED 'dd_2pc';
SELECT flushed() AS commit_prepared_durable;
:deltas;
SELECT count(*) FROM t;

-- Reset is superuser-only by default.
CREATE ROLE dd_reader;
SET ROLE dd_reader;
SELECT count(*) >= 1 AS visible FROM delayed_durability_stats;
SELECT delayed_durability_stats_reset();
RESET ROLE;
DROP ROLE dd_reader;
SELECT delayed_durability_stats_reset();
SELECT commits_durable, commits_delayed, delayed_requests_ignored,
       commits_forced_durable, flush_log_calls, stats_reset > now() - interval '1 hour' AS recent
  FROM delayed_durability_stats WHERE datname = current_database();

DROP PROCEDURE insert_loop;
DROP TABLE t;
DROP FUNCTION counters;
DROP FUNCTION flushed;
