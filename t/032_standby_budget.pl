# The loss budget kept against a standby (budget_standby_slot): after
# every delayed commit, the standby of the slot has confirmed WAL up to
# max_loss_bytes before its commit record (judged by PostgreSQL's own
# pg_replication_slots); without the setting, a stalled standby falls
# behind unbounded (the control); under max_loss_time, a commit made when
# the standby lacks an older acknowledged commit waits for it; a wait ends
# on cancel with a WARNING, the
# commit standing; with nothing streaming from the slot, commits fall back
# to the local bound, counted and logged; a failover then loses only
# commits within the budget past the switch point, judged by the rows.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use DelayedDurabilityTest;

my $budget = 8192;
# wal_sender_timeout = 0: a standby whose WAL receiver is stopped stays
# connected (streaming) however long a check takes.
# A record of 64 acknowledgements, so that a stalled standby outlasts it.
my $primary = new_dd_node('sb_primary', init => { allows_streaming => 1 },
	conf => "wal_sender_timeout = 0\ndelayed_durability.lost_commits_ring_size = 64\n");
$primary->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
CREATE TABLE t (k int PRIMARY KEY, pad text);
SELECT pg_create_physical_replication_slot('sb');
SELECT flush_log();
});
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('sb_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->append_conf('postgresql.conf', "primary_slot_name = 'sb'\n");
$standby->start;
$primary->wait_for_catchup($standby);
$primary->safe_psql('postgres', "ALTER SYSTEM SET delayed_durability.max_loss_bytes = '${budget}B'; SELECT pg_reload_conf()");


sub budget_state
{
	my %s;
	@s{qw(streaming waited fallen canceled)} = split /\|/, $primary->safe_psql('postgres',
		'SELECT streaming, commits_waited, commits_fallen_back, waits_canceled FROM delayed_durability_standby_budget');
	return %s;
}

# $n delayed commits of about 300 bytes each from one session; after each,
# how far its commit record ends past what the slot's standby confirmed.
sub gaps
{
	my ($from, $n) = @_;
	my $out = $primary->safe_psql('postgres', join('', map {
		"INSERT INTO t VALUES ($_, repeat('x', 200));\n"
		  . "SELECT last_commit_lsn() - restart_lsn FROM pg_replication_slots WHERE slot_name = 'sb';\n"
	} $from .. $from + $n - 1));
	return split /\n/, $out;
}

sub max_of { my $m = -1e18; $m = $_ > $m ? $_ : $m for @_; return $m }

# ---- control: the local budget alone does not bound a stalled standby.
my $receiver = pause_wal_receiver($standby);
my @control = gaps(1, 200);
kill 'CONT', $receiver;
cmp_ok(max_of(@control), '>', 4 * $budget, 'control: without budget_standby_slot, a stalled standby falls far behind (' . max_of(@control) . ' bytes)');
$primary->safe_psql('postgres', 'SELECT flush_log()');
$primary->wait_for_catchup($standby);

# ---- with the slot named: every delayed commit within the budget.
$primary->safe_psql('postgres', "ALTER SYSTEM SET delayed_durability.budget_standby_slot = 'sb'; SELECT pg_reload_conf()");
my %before = budget_state();
is($before{streaming}, 't', 'the view sees the standby streaming from the slot');
my @gaps = gaps(1001, 300);
is(scalar @gaps, 300, 'a gap for each commit');
cmp_ok(max_of(@gaps), '<=', $budget, "after every delayed commit the standby had confirmed WAL up to $budget bytes before its commit record (max " . max_of(@gaps) . ')');
my %after = budget_state();
cmp_ok($after{waited} - $before{waited}, '>=', 5, 'commits waited for the standby (' . ($after{waited} - $before{waited}) . ')');
is($after{fallen} - $before{fallen}, 0, 'none fell back while it streamed');
ok($primary->log_contains(qr/the loss budget is kept against the standby of replication slot "sb"/), 'logged');

# ---- a wait ends on cancel; the commit stands.
$receiver = pause_wal_receiver($standby);
my ($out, $err) = ('', '');
my $h = IPC::Run::start([ 'psql', '-X', '-d', $primary->connstr('postgres'), '-c',
	"INSERT INTO t SELECT g, repeat('y', 200) FROM generate_series(5001, 5100) AS g" ], '>', \$out, '2>', \$err);
my $waiting = $primary->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE 'INSERT INTO t SELECT g%' AND wait_event_type = 'Extension'");
ok($waiting, 'a commit past the budget waits for the stalled standby');
$primary->safe_psql('postgres', "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE 'INSERT INTO t SELECT g%'");
$h->finish;
like($err, qr/WARNING:  canceling the wait for the standby of replication slot "sb" due to user request/, 'cancel: a WARNING');
like($out, qr/INSERT 0 100/, 'cancel: the commit stands');
is($primary->safe_psql('postgres', 'SELECT count(*) FROM t WHERE k BETWEEN 5001 AND 5100'), '100', 'its rows are there');
%after = budget_state();
is($after{canceled} - $before{canceled}, 1, 'counted as canceled');
kill 'CONT', $receiver;
$primary->wait_for_catchup($standby);

# A one-row delayed commit from its own psql (its output into $out):
# returns its handle, and whether it was seen waiting for the standby.
sub commit_in_background
{
	my ($k) = @_;
	($out, $err) = ('', '');
	my $handle = IPC::Run::start([ 'psql', '-X', '-d', $primary->connstr('postgres'), '-c', "INSERT INTO t VALUES ($k, 'bg')" ],
		'>', \$out, '2>', \$err);
	my $seen_waiting = $primary->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE 'INSERT INTO t VALUES ($k,%' AND wait_event_type = 'Extension'");
	return ($handle, $seen_waiting);
}

# ---- the time budget against the standby: a delayed commit made when the
# oldest acknowledged commit the standby has not confirmed (judged by
# pg_replication_slots) is max_loss_time old waits for the standby.
$primary->safe_psql('postgres', q{
ALTER SYSTEM SET delayed_durability.max_loss_bytes = 0;
ALTER SYSTEM SET delayed_durability.max_loss_time = '1s';
SELECT pg_reload_conf();
SELECT flush_log();
});
$primary->poll_query_until('postgres', "SELECT current_setting('delayed_durability.max_loss_time') = '1s'") or die;
$primary->wait_for_catchup($standby);
%before = budget_state();
$receiver = pause_wal_receiver($standby);
my $young = $primary->safe_psql('postgres', "INSERT INTO t VALUES (6001, 'young'); SELECT last_commit_lsn()", timeout => 60);
is($primary->safe_psql('postgres', "SELECT restart_lsn < '$young' FROM pg_replication_slots WHERE slot_name = 'sb'"), 't',
	'time budget: a delayed commit the stalled standby lacks returned at once (its own age is 0)');
# Flushed here: only the standby lacks it (the local time budget's scan
# of the record passes it by).
$primary->safe_psql('postgres', 'SELECT flush_log()');
is($primary->safe_psql('postgres', "SELECT pg_current_wal_flush_lsn() >= '$young'"), 't',
	'time budget: that commit is flushed here');
usleep(1_500_000);
($h, $waiting) = commit_in_background(6002);
ok($waiting, 'time budget: a commit made when the standby lacks one acknowledged 1.5 s ago waits for the standby');
$h->pump_nb;
is($out, '', '... and its client has not heard of it');
is($primary->safe_psql('postgres', "SELECT restart_lsn < '$young' FROM pg_replication_slots WHERE slot_name = 'sb'"), 't',
	'... while the standby has still not confirmed the older commit');
kill 'CONT', $receiver;
$h->finish;
like($out, qr/INSERT 0 1/, 'time budget: the commit returns once the standby confirmed it');
is($primary->safe_psql('postgres', "SELECT restart_lsn >= '$young' FROM pg_replication_slots WHERE slot_name = 'sb'"), 't',
	'... the older one included');
%after = budget_state();
is($after{waited} - $before{waited}, 1, 'time budget: one commit waited');

# ---- the record went round (64 entries) while the standby was stalled:
# the commit it lacks for longest is no longer in the record, yet its age
# still counts; the commits in between, from three sessions at once, do
# not wait for want of it.
$primary->safe_psql('postgres', 'SELECT flush_log()');
$primary->wait_for_catchup($standby);
$primary->safe_psql('postgres', "ALTER SYSTEM SET delayed_durability.max_loss_time = '10s'; SELECT pg_reload_conf()");
$primary->poll_query_until('postgres', "SELECT current_setting('delayed_durability.max_loss_time') = '10s'") or die;
%before = budget_state();
$receiver = pause_wal_receiver($standby);
$young = $primary->safe_psql('postgres', "INSERT INTO t VALUES (6101, 'oldest'); SELECT last_commit_lsn()", timeout => 60);
# After its acknowledgement: its age at the check below is at least the
# time measured from here.
my $started = Time::HiRes::time();
# Flushed here, so that only the standby lacks it: the record's summary of
# overwritten entries keeps only those unflushed here.
$primary->safe_psql('postgres', 'SELECT flush_log()');
# The commits in between are then at most 7.5 s old at the check: alone,
# they would not make it wait.
usleep(3_000_000);
my @lappers = map {
	my $first = 6201 + 40 * $_;
	# One transaction per line (a -c string would be one transaction).
	my $lines = join('', map { "INSERT INTO t VALUES ($_, 'lap');\n" } $first .. $first + 39);
	IPC::Run::start([ 'psql', '-X', '-q', '-d', $primary->connstr('postgres'), '-v', 'ON_ERROR_STOP=1' ],
		'<', \$lines, '>', \my $lap_out, '2>', \my $lap_err, IPC::Run::timeout(60))
} 0 .. 2;
$_->finish for @lappers;
is($primary->safe_psql('postgres', "SELECT count(*) FROM t WHERE k BETWEEN 6201 AND 6320"), '120',
	'ring overwritten: 120 delayed commits after it, from three sessions at once, returned without waiting');
usleep(int(max_of(0, 10.5 - (Time::HiRes::time() - $started)) * 1_000_000));
($h, $waiting) = commit_in_background(6400);
ok($waiting, 'ring overwritten: a commit made 10.5 s after the oldest commit the standby lacks waits, though that one left the record');
is($primary->safe_psql('postgres', "SELECT restart_lsn < '$young' FROM pg_replication_slots WHERE slot_name = 'sb'"), 't',
	'... while the standby still lacks it');
kill 'CONT', $receiver;
$h->finish;
like($out, qr/INSERT 0 1/, '... and returns once the standby confirmed it');
%after = budget_state();
is($after{waited} - $before{waited}, 1, 'ring overwritten: only that commit waited');
$primary->safe_psql('postgres', "ALTER SYSTEM SET delayed_durability.max_loss_bytes = '${budget}B'; ALTER SYSTEM RESET delayed_durability.max_loss_time; SELECT pg_reload_conf()");
$primary->poll_query_until('postgres', "SELECT current_setting('delayed_durability.max_loss_time') = '0'") or die;

# ---- nothing streams from the slot: no wait, the local bound, counted.
$standby->stop;
$primary->poll_query_until('postgres', "SELECT NOT active FROM pg_replication_slots WHERE slot_name = 'sb'") or die;
%before = budget_state();
is($before{streaming}, 'f', 'the view sees nothing streaming from the slot');
my $local = $primary->safe_psql('postgres', join('', map {
	"INSERT INTO t VALUES ($_, repeat('z', 200));\nSELECT last_commit_lsn() - pg_current_wal_flush_lsn();\n"
} 7001 .. 7100));
cmp_ok(max_of(split /\n/, $local), '<=', $budget, 'without the standby, the local budget still holds');
%after = budget_state();
cmp_ok($after{fallen} - $before{fallen}, '>=', 1, 'commits past the standby budget fell back, counted (' . ($after{fallen} - $before{fallen}) . ')');
is($after{waited} - $before{waited}, 0, 'and none waited');
my @fallback_lines = slurp_file($primary->logfile) =~ /nothing streams from replication slot "sb": the loss budget is kept against this server's flush position only/g;
is(scalar @fallback_lines, 1, 'logged once');
$standby->start;
$primary->wait_for_catchup($standby);

# ---- failover: the standby promoted after a kill -9 of the primary lacks
# only commits within the budget past where its WAL ends.
my %receipt = map { /^(\d+) (\S+)$/ ? ($1 => $2) : () } split /\n/, $primary->safe_psql('postgres', join('', map {
	"INSERT INTO t VALUES ($_, repeat('w', 200));\nSELECT '$_ ' || last_commit_lsn();\n"
} 9001 .. 9300));
is(scalar keys %receipt, 300, 'failover run: 300 delayed commits acknowledged');
kill_everything($primary);
my $standby_end = $standby->safe_psql('postgres', 'SELECT pg_last_wal_receive_lsn()');
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die;
my %present = map { $_ => 1 } split /\n/, $standby->safe_psql('postgres', 'SELECT k FROM t WHERE k > 9000');
my @lost = grep { !$present{$_} } sort { $a <=> $b } keys %receipt;
my $furthest = max_of(0, map { lsn_to_int($receipt{$_}) - lsn_to_int($standby_end) } @lost);
cmp_ok($furthest, '<=', $budget, scalar(@lost) . " acknowledged commits lost in the failover, all within $budget bytes past the standby's WAL (furthest $furthest)");
is(join(',', grep { $present{$_} } @lost), '', 'consistent');

$standby->stop;
done_testing();
