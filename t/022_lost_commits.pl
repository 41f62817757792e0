# The report of acknowledged delayed commits lost in a crash: compared with
# the client's own log of acknowledged transactions, after a crash of one
# process (crash restart), of every process (kill -9), a simulated
# operating-system restart, a clean restart, with the record off, and with
# more unflushed commits than the record holds.
use strict;
use warnings;
use File::Spec;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('lost', init => { allows_streaming => 1 }, conf => "delayed_durability.lost_commits_ring_size = 64\nrestart_after_crash = on\n");
$node->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
CREATE TABLE acked (xid xid8 PRIMARY KEY, n int);
});

# Commits $n delayed transactions, each inserting its own xid; returns the
# client's log of acknowledged xids (each printed after its COMMIT returned).
# %commit_end keeps where each one's commit record lies: between
# PostgreSQL's insert positions taken just before COMMIT and right after
# it. A lost commit is matched by xid and position, as xids are reused
# after a crash.
my %commit_end;
sub commit_delayed_rows
{
	my ($n, $tag) = @_;
	# wal_end() is called once first: its first call reads catalogs, and
	# with shared_buffers = 1MB (a streaming node) that can evict the page
	# a delayed commit dirtied, whose write flushes WAL past the commit.
	my $script = "SELECT wal_end() IS NOT NULL;\n" . join('', map {
		"BEGIN;\nINSERT INTO acked SELECT pg_current_xact_id(), $_;\n"
		  . "SELECT 'xid=' || pg_current_xact_id() || ' ' || wal_end();\nCOMMIT;\nSELECT 'acked ' || wal_end();\n"
	} 1 .. $n);
	my @lines = split /\n/, $node->safe_psql('postgres', $script);
	my (@acked, $pending, $before);
	for (@lines)
	{
		($pending, $before) = ($1, $2) if /^xid=(\d+) (\S+)$/;
		if (/^acked (\S+)$/ && defined $pending)
		{
			push @acked, $pending;
			# The commit record lies after the position taken before COMMIT
			# and ends at or before the one taken after (later WAL, such as
			# a pruned catalog page, can only move that one further).
			# An xid lost in a crash is given again afterwards: each window.
			push @{ $commit_end{$pending} }, [ lsn_to_int($before), lsn_to_int($1) ];
		}
	}
	return @acked;
}

sub present_xids
{
	return map { $_ => 1 } split /\n/, $node->safe_psql('postgres', 'SELECT xid FROM acked');
}

sub reported
{
	my ($since) = @_;
	return split /\n/, $node->safe_psql('postgres',
		"SELECT xid FROM delayed_durability_lost_commits WHERE crash_recovered_at > '$since' ORDER BY commit_lsn");
}

sub crash_row
{
	my ($since) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(lost_commits::text, 'NULL'), summarized_commits, exact, detail FROM delayed_durability_crashes WHERE crash_recovered_at > '$since'");
}

sub wait_for_report
{
	my ($since) = @_;
	$node->poll_query_until('postgres', "SELECT count(*) > 0 FROM delayed_durability_crashes WHERE crash_recovered_at > '$since'")
	  or die 'no crash report';
}

sub now { return $node->safe_psql('postgres', 'SELECT clock_timestamp()'); }

# kill -9 of every process, and the WAL the server had not flushed treated
# as never written (WAL written but not flushed may or may not survive a
# crash of PostgreSQL: the WAL writer writes completed pages early). Then
# the server starts again. The record itself is intact: no machine crash.
sub crash_losing_unflushed_wal
{
	my $flushed_at = lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
	kill_everything($node);
	zero_wal_after($node, $flushed_at);
	$node->start;
}

# From a flushed start, commits $n delayed rows, crashes with $crash and
# waits for the report. Returns when the crash began and the acknowledged
# xids absent after it.
sub delayed_rows_through_crash
{
	my ($n, $crash) = @_;
	settle_wal_writer($node);
	$node->safe_psql('postgres', 'SELECT flush_log()');
	my @acked = commit_delayed_rows($n);
	my $since = now();
	$crash->();
	wait_for_report($since);
	my %present = present_xids();
	return ($since, grep { !$present{$_} } @acked);
}

# A reloaded setting reaches new sessions only once the postmaster re-read
# the file.
sub reload_until
{
	my ($setting, $value) = @_;
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
	$node->poll_query_until('postgres', "SELECT current_setting('$setting') = '$value'") or die "$setting not $value";
}

# ---- crash of one process: the postmaster restarts the others
settle_wal_writer($node);
$node->safe_psql('postgres', 'SELECT flush_log()');
my @acked = commit_delayed_rows(10);
$node->safe_psql('postgres', 'SELECT flush_log()');
push @acked, commit_delayed_rows(12);
is(scalar @acked, 22, '22 delayed commits acknowledged');
my $since = now();
my $log_offset = -s $node->logfile;
my $walwriter = $node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'});
kill 'KILL', $walwriter;
# A connection accepted before the postmaster saw the death would prove nothing.
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
$node->poll_query_until('postgres', 'SELECT 1', '1') or die 'no restart';
wait_for_report($since);
my %present = present_xids();
my @absent = grep { !$present{$_} } @acked;
cmp_ok(scalar @absent, '>', 0, scalar(@absent) . ' acknowledged commits lost when the WAL writer was killed');
is_deeply([ reported($since) ], \@absent, 'the report lists exactly the acknowledged commits absent from the table, in commit order');
like(crash_row($since), qr/^${\ scalar @absent}\|0\|t\|exact: /, 'crash row: exact, with the count');
ok($node->log_contains(qr/delayed_durability: ${\ scalar @absent} acknowledged delayed commits were lost \(LSN [0-9A-F\/]+\.\.[0-9A-F\/]+, acknowledged between /, $log_offset),
	'one LOG line at startup says how many and when');
is($node->safe_psql('postgres',
	"SELECT bool_and(datname = 'postgres' AND acknowledged_at < crash_recovered_at) FROM delayed_durability_lost_commits WHERE crash_recovered_at > '$since'"),
	't', 'database and acknowledgement time reported');

# ---- kill -9 of every process (a PostgreSQL crash, not of the machine)
($since, @absent) = delayed_rows_through_crash(15, \&crash_losing_unflushed_wal);
is(scalar @absent, 15, 'the 15 unflushed commits lost when every process was killed');
is_deeply([ reported($since) ], \@absent, 'after kill -9 of the server the report is exact too');
like(crash_row($since), qr/^${\ scalar @absent}\|0\|t\|/, '... and says so');

# ---- pg_ctl stop -m immediate is a crash too: the WAL writer is idle, so
# the commits' WAL never left shared memory and is lost
($since, @absent) = delayed_rows_through_crash(6, sub { $node->stop('immediate'); $node->start; });
cmp_ok(scalar @absent, '>', 0, 'an immediate shutdown lost delayed commits');
is_deeply([ reported($since) ], \@absent, 'after an immediate shutdown the report lists exactly the absent ones ('
	  . scalar(@absent) . ')');
like(crash_row($since), qr/^${\ scalar @absent}\|0\|t\|/, '... exactly');

# ---- a crash that lost nothing: everything was flushed
$node->safe_psql('postgres', 'SELECT flush_log()');
@acked = commit_delayed_rows(3);
$node->safe_psql('postgres', 'SELECT flush_log()');
$since = now();
kill_everything($node);
$node->start;
wait_for_report($since);
like(crash_row($since), qr/^0\|0\|t\|exact: 0 of \d+ /, 'a crash after flush_log(): 0 lost, exact');
is(scalar(reported($since)), 0, 'nothing listed');

# ---- clean restart: nothing is lost, nothing reported
my $crashes = $node->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_crashes');
commit_delayed_rows(5);
$node->restart;
$node->safe_psql('postgres', 'SELECT pg_sleep(0.5)');
is($node->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_crashes'), $crashes,
	'a clean restart adds no crash report');

# ---- simulated operating-system restart: the record is not on persistent
# memory, so the page cache it lived in is gone; its header carries the
# boot id, which is what changes.
settle_wal_writer($node);
$node->safe_psql('postgres', 'SELECT flush_log()');
@acked = commit_delayed_rows(4);
$since = now();
kill_everything($node);
my $ring = $node->data_dir . '/delayed_durability/commits';
open my $fh, '+<:raw', $ring or die "$ring: $!";
seek $fh, 32, 0;
print $fh 'another-boot-' . ('0' x 27);
close $fh;
$node->start;
wait_for_report($since);
like(crash_row($since), qr/^NULL\|0\|f\|unknown: the record of acknowledged commits did not survive the operating-system restart/,
	'after an operating-system restart without persistent memory: unknown, not 0');

# ---- the record off: unknown
$node->safe_psql('postgres', 'ALTER SYSTEM SET delayed_durability.track_lost_commits = off');
reload_until('delayed_durability.track_lost_commits', 'off');
settle_wal_writer($node);
commit_delayed_rows(2);
$since = now();
kill_everything($node);
$node->start;
wait_for_report($since);
like(crash_row($since), qr/^NULL\|0\|f\|unknown: delayed commits were acknowledged while delayed_durability.track_lost_commits was off/,
	'commits acknowledged while track_lost_commits was off: unknown');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET delayed_durability.track_lost_commits');
reload_until('delayed_durability.track_lost_commits', 'on');

# ---- more unflushed commits than the record holds (64): the oldest are
# summarized, the newest 64 listed, and the report says it is not exact.
($since, @absent) = delayed_rows_through_crash(100, \&crash_losing_unflushed_wal);
is(scalar @absent, 100, 'all 100 unflushed commits lost');
is_deeply([ reported($since) ], [ @absent[36 .. 99] ], 'the newest 64 are listed');
like(crash_row($since), qr/^64\|36\|f\|64 listed, and up to 36 more that the full record summarized/,
	'the 36 summarized ones are counted, and the report is not called exact');

# ---- crashes before the comparison ran: without a worker slot
# (max_worker_processes = 0) the record of a crash waits; a further crash
# makes it unknown (new WAL reuses its positions). The last crash, with the
# worker back, is compared exactly.
$node->append_conf('postgresql.conf', "max_worker_processes = 0\nmax_parallel_workers = 0\n");
$node->restart;
settle_wal_writer($node);
$node->safe_psql('postgres', 'SELECT flush_log()');
# In each batch the first commit is flushed: it survives, and a listing
# that named it would be wrong.
my @flushed_first;
push @flushed_first, commit_delayed_rows(1);
$node->safe_psql('postgres', 'SELECT flush_log()');
commit_delayed_rows(2);
$since = now();
crash_losing_unflushed_wal();
ok(-f $node->data_dir . '/delayed_durability/pending', 'the crash waits to be compared');
push @flushed_first, commit_delayed_rows(1);
$node->safe_psql('postgres', 'SELECT flush_log()');
commit_delayed_rows(2);
crash_losing_unflushed_wal();
$node->append_conf('postgresql.conf', "max_worker_processes = 8\nmax_parallel_workers = 8\n");
@acked = commit_delayed_rows(3);
crash_losing_unflushed_wal();
$node->poll_query_until('postgres', "SELECT count(*) = 3 FROM delayed_durability_crashes WHERE crash_recovered_at > '$since'")
  or die 'no reports';
is($node->safe_psql('postgres', "SELECT string_agg(coalesce(lost_commits::text, 'NULL') || ' ' || exact::int, ',' ORDER BY detail LIKE 'unknown%', detail) FROM delayed_durability_crashes WHERE crash_recovered_at > '$since'"),
	'3 1,NULL 0,NULL 0', 'the last crash is reported exactly, the two before it as unknown');
# How many of an unknown crash's commits are listed depends on where the
# WAL written after each restart ends (a listed one lies past all recovered
# WAL): from 0 to its 3, and each one listed is absent from the table.
is($node->safe_psql('postgres', "SELECT bool_and(detail ~ '^unknown: another crash came before the record of this one was compared; the [0-3] listed are certainly lost\$') FROM delayed_durability_crashes WHERE crash_recovered_at > '$since' AND NOT exact"),
	't', '... saying why');
# Listed commits by (xid, commit position): each is a commit the client
# was acknowledged, and absent from the table; the flushed first commits
# of the batches are present and never listed.
my @listed = map { [ split /\|/ ] } split /\n/, $node->safe_psql('postgres',
	"SELECT xid, commit_lsn FROM delayed_durability_lost_commits WHERE crash_recovered_at > '$since'");
my %present_now = map { $_ => 1 } split /\n/, $node->safe_psql('postgres', 'SELECT xid FROM acked');
my $within = sub {
	my ($xid, $lsn) = @_;
	return scalar grep { lsn_to_int($lsn) > $_->[0] && lsn_to_int($lsn) <= $_->[1] } @{ $commit_end{$xid} // [] };
};
# (Present by xid: a lost xid given again to a later commit that survived
# is present; its window then tells the two apart.)
my @wrong = grep { !$within->(@$_) } @listed;
is(scalar @wrong, 0, '... every commit listed is one the client was acknowledged at that position, and absent from the table');
is(join(',', grep { !$present_now{$_} } @flushed_first), '', 'the flushed first commit of each batch survived');
my %flushed_first = map { $_ => 1 } @flushed_first;
is(join(',', map { $_->[0] } grep { $flushed_first{ $_->[0] } && $within->(@$_) } @listed), '', '... and is never listed');

# ---- a base backup taken with a comparison pending starts without comparing
$node->append_conf('postgresql.conf', "max_worker_processes = 0\n");
$node->restart;
commit_delayed_rows(2);
crash_losing_unflushed_wal();
ok(-f $node->data_dir . '/delayed_durability/pending', 'a comparison is pending on the primary');
$node->backup('with_pending');
my $copy = PostgreSQL::Test::Cluster->new('copy');
$copy->init_from_backup($node, 'with_pending');
$copy->append_conf('postgresql.conf', "max_worker_processes = 8\n");
my $crashes_in_copy = $node->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_crashes');
$copy->start;
ok($copy->log_contains(qr/the server starts from a base backup; the record of acknowledged delayed commits it holds is another server.s and is not compared/),
	'the copy says it does not compare');
ok(!-e $copy->data_dir . '/delayed_durability/pending', "the primary's pending comparison is dropped in the copy");
$copy->safe_psql('postgres', 'SELECT pg_sleep(1)');
is($copy->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_crashes'), $crashes_in_copy,
	"the copy reports no crash of its own (it shows the primary's history)");
$copy->stop;
$node->append_conf('postgresql.conf', "max_worker_processes = 8\n");
$node->restart;

# ---- receipts of commits a crash lost read lost, and go on doing so once
# the report is reset (it keeps when each crash was recovered, and up to
# where), whatever WAL is written at their positions since.
settle_wal_writer($node);
$node->safe_psql('postgres', 'SELECT flush_log()');
my @lost_receipts = split /\n/, $node->safe_psql('postgres',
	join('', map { "INSERT INTO acked SELECT pg_current_xact_id(), -$_;\nSELECT last_commit_receipt();\n" } 1 .. 3));
my $receipts_flushed = lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
my $receipts_since = now();
kill_everything($node);
zero_wal_after($node, $receipts_flushed);
$node->start;
wait_for_report($receipts_since);
my $receipt_statuses = sub {
	return $node->safe_psql('postgres', 'SELECT string_agg(s.status, \',\' ORDER BY r) FROM unnest(ARRAY['
		  . join(',', map { "'$_'" } @lost_receipts) . ']) AS r, receipt_status(r) AS s');
};
is($receipt_statuses->(), 'lost,lost,lost', 'receipts of the commits the crash lost read lost');

# ---- privileges and reset
$node->safe_psql('postgres', 'CREATE ROLE monitor LOGIN');

my ($ret, $out, $err) = $node->psql('postgres', 'SELECT count(*) FROM delayed_durability_lost_commits', extra_params => [ '-U', 'monitor' ]);
like($err, qr/permission denied for view delayed_durability_lost_commits/, 'not readable by default');
($ret, $out, $err) = $node->psql('postgres', 'SELECT count(*) FROM delayed_durability_lost_commit_rows()', extra_params => [ '-U', 'monitor' ]);
like($err, qr/permission denied for view delayed_durability_lost_commits/, 'nor through the function under the view');
$node->safe_psql('postgres', 'GRANT SELECT ON delayed_durability_lost_commits, delayed_durability_crashes TO monitor');
cmp_ok($node->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_lost_commits', extra_params => [ '-U', 'monitor' ]),
	'>', 0, 'readable once granted');
($ret, $out, $err) = $node->psql('postgres', 'SELECT delayed_durability_lost_commits_reset()', extra_params => [ '-U', 'monitor' ]);
like($err, qr/permission denied for function delayed_durability_lost_commits_reset/, 'reset is for superusers');
$node->safe_psql('postgres', 'SELECT delayed_durability_lost_commits_reset()');
is($node->safe_psql('postgres', 'SELECT (SELECT count(*) FROM delayed_durability_lost_commits) + (SELECT count(*) FROM delayed_durability_crashes)'),
	'0', 'reset empties the report');
$node->safe_psql('postgres', 'CREATE TABLE filler (i int); INSERT INTO filler SELECT generate_series(1, 500); SELECT flush_log()');
is($receipt_statuses->(), 'lost,lost,lost', 'after the reset, and WAL flushed past their positions, they still read lost');
$node->restart;
is($node->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_crashes'), '0', 'and it stays empty');
$node->stop;

# ---- with the persistent WAL buffer on persistent memory the record lives
# next to it and survives an operating-system restart: the report stays
# exact. (libpmem is told the file is persistent memory; the file system is
# a disk one, as a DAX mount would be.)
# Absolute: the server reads the path from its data directory, and 18's
# tempdir() returns a path relative to the test's directory.
my $pmem_dir = File::Spec->rel2abs(PostgreSQL::Test::Utils::tempdir('pmem'));
my $buffer = "$pmem_dir/wal.buf";
{
	local $ENV{PMEM_IS_PMEM_FORCE} = '1';
	my $pm = new_dd_node('lost_pmem', conf => "delayed_durability.wal_buffer_path = '$buffer'\n");
	ok(-f "$buffer.commits", 'the record is next to the WAL buffer');
	ok(!-e $pm->data_dir . '/delayed_durability/commits', 'not in the data directory');
	ok($pm->log_contains(qr/acknowledged delayed commits are recorded on persistent memory in "\Q$buffer.commits\E"/),
		'the server says where');
	$pm->safe_psql('postgres', q{ALTER DATABASE postgres SET delayed_durability.mode = 'forced'; CREATE TABLE acked (xid xid8, n int)});
	settle_wal_writer($pm);
	$pm->safe_psql('postgres', 'SELECT flush_log()');
	# A real power cut: what strace did not see synced is zeroed (what the
	# WAL buffer holds comes back), and the machine's boot id changes.
	my $pm_trace = start_fsync_trace($pm);
	my @pm_acked = split /\n/, $pm->safe_psql('postgres',
		join('', map { "INSERT INTO acked SELECT pg_current_xact_id(), $_ RETURNING xid;\n" } 1 .. 5));
	my $pm_since = $pm->safe_psql('postgres', 'SELECT clock_timestamp()');
	kill_everything($pm);
	stop_fsync_trace($pm_trace);
	zero_unsynced_wal($pm, $pm_trace);
	open my $bh, '+<:raw', "$buffer.commits" or die $!;
	seek $bh, 32, 0;
	print $bh 'another-boot-' . ('0' x 27);
	close $bh;
	$pm->start;
	$pm->poll_query_until('postgres', "SELECT count(*) > 0 FROM delayed_durability_crashes WHERE crash_recovered_at > '$pm_since'")
	  or die 'no crash report';
	like($pm->safe_psql('postgres', "SELECT lost_commits IS NOT NULL, exact FROM delayed_durability_crashes WHERE crash_recovered_at > '$pm_since'"),
		qr/^t\|t$/, 'after a simulated operating-system restart the report on persistent memory is exact');
	my %pm_present = map { $_ => 1 } split /\n/, $pm->safe_psql('postgres', 'SELECT xid FROM acked');
	my @pm_absent = grep { !$pm_present{$_} } @pm_acked;
	cmp_ok(scalar @pm_absent, '>', 0, scalar(@pm_absent) . ' unwritten delayed commits lost');
	is_deeply([ split /\n/, $pm->safe_psql('postgres', "SELECT xid FROM delayed_durability_lost_commits ORDER BY commit_lsn") ],
		\@pm_absent, '... and listed exactly');
	$pm->stop;
}

done_testing();
