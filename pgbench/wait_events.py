"""Wait events of the backends doing an experiment's work, sampled from
pg_stat_activity: PostgreSQL's counterpart of SQL Server's
sys.dm_os_wait_stats (experiments 4 and 6).
"""

# Wait events that are waits on the WAL (a commit's flush, a write, a new
# segment's creation).
WAL_WAITS = {("IO", "WALSync"), ("IO", "WALWrite"), ("LWLock", "WALWrite"), ("IO", "WALInitSync"),
             ("IO", "WALInitWrite")}


# One connection polls pg_stat_activity every 10 ms: it waits for the
# working backends (by application_name) to connect, counts the wait event
# of each active one, and stops once none has been connected for `idle` s (or at the time limit). The counts
# stay in a jsonb variable: no table, so the sampler writes no WAL.
WAIT_SAMPLER = """
DO $$
DECLARE
  t0 timestamptz := clock_timestamp();
  last_seen timestamptz;
  polls int := 0;
  connected int;
  counts jsonb := '{{}}';
  k text;
BEGIN
  LOOP
    PERFORM pg_stat_clear_snapshot();
    SELECT count(*) INTO connected FROM pg_stat_activity
     WHERE application_name = '{app}' AND pid <> pg_backend_pid();
    IF connected > 0 THEN
      last_seen := clock_timestamp();
      polls := polls + 1;
      FOR k IN SELECT coalesce(wait_event_type, 'CPU') || '|' || coalesce(wait_event, 'CPU (no wait event)')
                 FROM pg_stat_activity
                WHERE application_name = '{app}' AND state = 'active' AND pid <> pg_backend_pid() LOOP
        counts := jsonb_set(counts, ARRAY[k], to_jsonb(coalesce((counts ->> k)::int, 0) + 1));
      END LOOP;
    ELSIF last_seen IS NOT NULL AND clock_timestamp() - last_seen > interval '{idle} s' THEN
      EXIT;
    ELSIF last_seen IS NULL AND clock_timestamp() - t0 > interval '{start_timeout} s' THEN
      EXIT;
    END IF;
    EXIT WHEN clock_timestamp() - t0 > interval '{limit} s';
    PERFORM pg_sleep(0.01);
  END LOOP;
  PERFORM set_config('exp4.polls', polls::text, false);
  PERFORM set_config('exp4.waits', counts::text, false);
END $$;
SELECT 'polls|' || current_setting('exp4.polls');
SELECT 'wait|' || key || '|' || value
  FROM jsonb_each_text(current_setting('exp4.waits')::jsonb) ORDER BY value::int DESC, key;
"""


def sample_wait_events(c, out, start_timeout=60, limit=4 * 3600, app="pgbench", idle=0.3):
    """Runs WAIT_SAMPLER over one psql connection; fills out['polls'] and
    out['counts'] ([type, event, samples], most first) or out['error']."""
    try:
        lines = c.psql(WAIT_SAMPLER.format(start_timeout=start_timeout, limit=limit, app=app, idle=idle))
    except RuntimeError as e:
        out["error"] = str(e).splitlines()[0]
        return
    counts = []
    for line in lines:
        kind, rest = line.split("|", 1)
        if kind == "polls":
            out["polls"] = int(rest)
        elif kind == "wait":
            typ, event, n = rest.rsplit("|", 2)
            counts.append([typ, event, int(n)])
    out["counts"] = counts
