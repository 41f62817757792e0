-- Objects the experiments use; also usable by hand with psql -f.
CREATE EXTENSION IF NOT EXISTS delayed_durability;

CREATE TABLE IF NOT EXISTS t1 (col1 int NOT NULL);

-- Experiment 1 and 4: a loop of single-row inserts, each its own
-- transaction; with delayed = true each asks for delayed durability
-- (SQL Server's COMMIT WITH (DELAYED_DURABILITY = ON)).
CREATE OR REPLACE PROCEDURE insert_loop(n int, delayed boolean DEFAULT false)
LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..n LOOP
    IF delayed THEN PERFORM commit_delayed(); END IF;
    INSERT INTO t1 VALUES (i);
    COMMIT;
  END LOOP;
END $$;

-- Experiment 2: the same loop into a temporary table (tempdb's analogue:
-- its rows write no WAL).
CREATE OR REPLACE PROCEDURE insert_loop_temp(n int)
LANGUAGE plpgsql AS $$
BEGIN
  CREATE TEMP TABLE IF NOT EXISTS t1_temp (col1 int NOT NULL);
  COMMIT;
  FOR i IN 1..n LOOP
    INSERT INTO t1_temp VALUES (i);
    COMMIT;
  END LOOP;
END $$;

-- Experiment 4's primary case: one transaction inserting n rows one by one
-- (the article's WHILE loop in an explicit transaction); with delayed =
-- true it asks for delayed durability at its commit.
CREATE OR REPLACE PROCEDURE insert_transaction(n int, delayed boolean DEFAULT false)
LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..n LOOP
    INSERT INTO t1 VALUES (i);
  END LOOP;
  IF delayed THEN PERFORM commit_delayed(); END IF;
END $$;
