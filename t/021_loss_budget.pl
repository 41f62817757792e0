# The loss budget and the durability receipts. The WAL writer is idle for
# 10 s (wal_writer_delay), so every flush seen here was made by a commit
# that hit its budget, by flush_log(), or by nobody.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use DelayedDurabilityTest;

my $node = new_dd_node('budget');
$node->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
CREATE TABLE t (id int PRIMARY KEY, pad text);
CREATE ROLE app LOGIN;
GRANT ALL ON t TO app;
});

sub counter
{
	my ($name) = @_;
	return $node->safe_psql('postgres',
		"SELECT $name FROM delayed_durability_stats WHERE datname = 'postgres'");
}

# ---- byte budget: checked after every commit of a loop
my $budget = 4096;
settle_wal_writer($node);
my ($flushed_before, $delayed_before) = (counter('commits_budget_flushed'), counter('commits_delayed'));
my $script = "SET delayed_durability.max_loss_bytes = '4kB';\n";
$script .= "INSERT INTO t VALUES ($_, repeat('x', 300));\n"
  . "SELECT 'gap=' || (wal_end() - pg_current_wal_flush_lsn());\n" for 1 .. 80;
my @gaps = map { /^gap=(\d+)$/ ? $1 : () } split /\n/, $node->safe_psql('postgres', $script);
is(scalar @gaps, 80, 'a gap measured after each of 80 commits');
my @over = grep { $_ > $budget } @gaps;
is(scalar @over, 0, "unflushed WAL never above max_loss_bytes (largest gap: "
	  . (sort { $b <=> $a } @gaps)[0] . " bytes)");
my $unflushed_acks = grep { $_ > 0 } @gaps;
cmp_ok($unflushed_acks, '>', 40, 'most commits still returned without flushing');
my $budget_flushes = counter('commits_budget_flushed') - $flushed_before;
cmp_ok($budget_flushes, '>=', 80 * 350 / $budget - 1, "commits_budget_flushed grew ($budget_flushes)");
cmp_ok($budget_flushes, '<', 40, 'but only for the commits that hit the budget');
is(counter('commits_delayed') - $delayed_before, 80 - $budget_flushes,
	'a budget-flushed commit is not counted delayed');

# ---- time budget: a commit made 300 ms after an unflushed acknowledged
# one flushes (everything inserted, so the next one finds nothing unflushed
# and returns at once); commits 20 ms apart do not. Which commits flushed
# for the budget is read from commits_budget_flushed after each one (a WAL
# position check could be fooled by the background writer's periodic
# running-transactions record). The budget is the server's:
# settle_wal_writer()'s own delayed commit (another database) stays
# unflushed on a partial WAL page, so each run starts from flush_log().
sub budget_flushes_per_commit
{
	my ($setting, $pause, $first_id, $n) = @_;
	my $count = "SELECT 'b=' || commits_budget_flushed FROM delayed_durability_stats WHERE datname = 'postgres';\n";
	settle_wal_writer($node);
	my $script = "SET delayed_durability.max_loss_time = '$setting';\nSELECT flush_log();\n$count";
	$script .= ($_ > 1 || $pause < 0.1 ? "SELECT pg_sleep($pause);\n" : '')
	  . "INSERT INTO t VALUES (" . ($first_id + $_) . ");\n$count"
	  for 1 .. $n;
	my @totals = map { /^b=(\d+)$/ ? $1 : () } split /\n/, $node->safe_psql('postgres', $script);
	return map { $totals[$_] - $totals[$_ - 1] } 1 .. $#totals;
}
my @flushed = budget_flushes_per_commit('200ms', 0.3, 100, 6);
is_deeply(\@flushed, [ 0, 1, 0, 1, 0, 1 ],
	'max_loss_time 200ms: a commit made when the oldest unflushed one is 300 ms old flushes');
@flushed = budget_flushes_per_commit('5s', 0.02, 200, 3);
is_deeply(\@flushed, [ 0, 0, 0 ], 'within the time budget nothing is flushed');

# ---- the window as a monitor sees it
is($node->safe_psql('postgres', 'SELECT flush_log() IS NOT NULL; SELECT (delayed_durability_status()).oldest_unflushed_commit_age IS NULL'),
	"t\nt", 'oldest_unflushed_commit_age is NULL when everything is flushed');
# The age against the session's own clock: read right after the commit
# returned, then after a pause; they agree within 50 ms.
my $walwriter = pause_wal_writer($node);
my $age = $node->safe_psql('postgres', q{SELECT flush_log();
INSERT INTO t VALUES (300);
SELECT clock_timestamp() AS acked \gset
SELECT pg_sleep(0.3);
SELECT abs(extract(epoch FROM (delayed_durability_status()).oldest_unflushed_commit_age)
           - extract(epoch FROM clock_timestamp() - :'acked'::timestamptz)) < 0.05});
resume_wal_writer($walwriter);
is((split /\n/, $age)[-1], 't', 'oldest_unflushed_commit_age is how long ago the oldest unflushed commit was acknowledged (within 50 ms)');

# ---- settings: superuser-only (like mode), bounded, delegable with GRANT SET
my ($ret, $out, $err) = $node->psql('postgres', "SET delayed_durability.max_loss_bytes = '1MB'", extra_params => [ '-U', 'app' ]);
like($err, qr/permission denied to set parameter "delayed_durability.max_loss_bytes"/, 'a non-superuser cannot change the budget');
($ret, $out, $err) = $node->psql('postgres', "SET delayed_durability.max_loss_time = -1");
like($err, qr/outside the valid range for parameter "delayed_durability.max_loss_time"/, 'negative time budget refused');
$node->safe_psql('postgres', 'GRANT SET ON PARAMETER delayed_durability.max_loss_bytes TO app');
is($node->safe_psql('postgres', "SET delayed_durability.max_loss_bytes = '1MB'; SHOW delayed_durability.max_loss_bytes",
	extra_params => [ '-U', 'app' ]), '1MB', 'GRANT SET delegates the budget');

# ---- receipts
settle_wal_writer($node);
is($node->safe_psql('postgres', 'SELECT last_commit_lsn() IS NULL'), 't', 'no receipt before the first commit');
is($node->safe_psql('postgres', q{
INSERT INTO t VALUES (400);
SELECT last_commit_lsn() > '0/0' AND last_commit_lsn() <= wal_end(), is_durable(last_commit_lsn());
BEGIN; SELECT last_commit_lsn() IS NOT NULL; COMMIT;
SELECT flush_log() IS NOT NULL, is_durable(last_commit_lsn());}),
	"t|f\nt\nt|t", 'receipt: not durable after a delayed commit, durable after flush_log(), readable in a transaction block');
is($node->safe_psql('postgres', q{
SET delayed_durability.mode = 'disabled';
INSERT INTO t VALUES (401);
SELECT is_durable(last_commit_lsn()), last_commit_lsn() = wal_end()}),
	't|t', 'receipt of a durable commit: the end of its commit record, durable');
is($node->safe_psql('postgres', q{
INSERT INTO t VALUES (402);
SELECT last_commit_lsn() AS a \gset
SELECT count(*) FROM t WHERE id = 402;
SELECT last_commit_lsn() = :'a'}), "1\nt", 'a read-only transaction keeps the previous receipt');

settle_wal_writer($node);
is($node->safe_psql('postgres', q{
INSERT INTO t VALUES (403);
SELECT wait_durable(last_commit_lsn(), interval '100ms'), is_durable(last_commit_lsn())}),
	'f|f', 'wait_durable returns false at its timeout and forces no flush');

# A session that commits row $id delayed and waits for it without a
# timeout, the WAL writer idle for seconds; returned once it sleeps.
sub start_waiter
{
	my ($id, $what) = @_;
	settle_wal_writer($node);
	my $bg = $node->background_psql('postgres', on_error_stop => 0);
	$bg->query_safe("SET application_name = 'receipt_waiter'; INSERT INTO t VALUES ($id)");
	$bg->query_until(qr/waiting/, "\\echo waiting\nSELECT wait_durable(last_commit_lsn());\n");
	ok($node->poll_query_until('postgres',
		"SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE application_name = 'receipt_waiter'"),
		"$what: the waiter sleeps on its latch (wait event type Extension)");
	return $bg;
}

# Cancel.
my $bg = start_waiter(404, 'cancel');
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'receipt_waiter'");
ok($node->poll_query_until('postgres',
	"SELECT state = 'idle' FROM pg_stat_activity WHERE application_name = 'receipt_waiter'"), 'query cancel ends the wait');
ok($node->log_contains(qr/ERROR:  canceling statement due to user request/, $log_offset), '... with the usual error');
$bg->quit;
settle_wal_writer($node);
($ret, $out, $err) = $node->psql('postgres',
	"INSERT INTO t VALUES (405);\nSET statement_timeout = '300ms';\nSELECT wait_durable(last_commit_lsn());");
like($err, qr/canceling statement due to statement timeout/, 'statement_timeout ends the wait too');

# A fast shutdown ends a wait too (else pg_ctl stop would time out).
$bg = start_waiter(406, 'shutdown');
$log_offset = -s $node->logfile;
$node->stop('fast');
ok($node->log_contains(qr/FATAL:  terminating connection due to administrator command/, $log_offset),
	'a fast shutdown ends the wait');
eval { $bg->quit };
$node->start;

# With the default WAL writer timing the wait ends by itself.
$node->safe_psql('postgres', q{ALTER SYSTEM SET wal_writer_delay = '200ms'; SELECT pg_reload_conf();});
for my $i (1 .. 3)
{
	is($node->safe_psql('postgres',
		"INSERT INTO t VALUES (500 + $i); SELECT wait_durable(last_commit_lsn(), interval '30s')"),
		't', "wait_durable returns true once the WAL writer flushed (receipt $i)");
}

# A confirmed receipt survives a power cut made the moment wait_durable()
# returned: the WAL writer, idle again for 10 s, flushes nothing after that
# (the delayed commits that follow in the same session are lost).
$node->safe_psql('postgres', q{ALTER SYSTEM SET wal_writer_delay = '10s'; SELECT pg_reload_conf();});
settle_wal_writer($node);
is($node->safe_psql('postgres', "INSERT INTO t VALUES (600);\n"
	  . "SELECT wait_durable(last_commit_lsn(), interval '60s');\n"
	  . join('', map { "INSERT INTO t VALUES ($_);\n" } 601 .. 610)),
	't', 'wait_durable confirmed the receipt');
power_cut($node);
is($node->safe_psql('postgres', 'SELECT count(*) FILTER (WHERE id = 600), count(*) FILTER (WHERE id > 600) FROM t WHERE id BETWEEN 600 AND 610'),
	'1|0', 'the confirmed commit survived the power cut; the unconfirmed ones after it did not');

# ---- power cut: the lost fit the budget
settle_wal_writer($node);
my $acks = $node->safe_psql('postgres',
	"SET delayed_durability.max_loss_bytes = '8kB';\n"
	  . join('', map { "INSERT INTO t VALUES ($_, repeat('y', 200));\nSELECT 'ack=$_=' || last_commit_lsn();\n" } 1000 .. 1099));
my %lsn_of = map { /^ack=(\d+)=(.*)$/ ? ($1 => lsn_to_int($2)) : () } split /\n/, $acks;
is(scalar keys %lsn_of, 100, '100 delayed commits acknowledged with receipts');
my $flushed_at = lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
power_cut($node);
my %present = map { $_ => 1 } split /\n/, $node->safe_psql('postgres', 'SELECT id FROM t WHERE id >= 1000');
my @lost = grep { !$present{$_} } sort { $a <=> $b } keys %lsn_of;
cmp_ok(scalar @lost, '>', 0, scalar(@lost) . ' acknowledged delayed commits lost');
my @lost_beyond = grep { $lsn_of{$_} <= $flushed_at } @lost;
is(scalar @lost_beyond, 0, 'only commits past the flushed position were lost');
my $span = (sort { $b <=> $a } map { $lsn_of{$_} } @lost)[0] - $flushed_at;
cmp_ok($span, '<=', 8192, "the lost commits lie within max_loss_bytes of WAL after the flushed position ($span bytes)");
my @kept_after = grep { $present{$_} && $lsn_of{$_} > $flushed_at } keys %lsn_of;
is(scalar @kept_after, 0, 'and every commit past it was lost (the cut is where the disk stood)');

done_testing();
