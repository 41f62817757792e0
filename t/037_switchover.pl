# A switchover: the primary shut down cleanly, then its standby was
# promoted. PostgreSQL's shutdown waits until its WAL senders have sent all
# its WAL, so nothing was lost; but the same shutdown checkpoint record
# also ends a crash recovery, after which commits can be lost, so the
# promoted server cannot tell from its WAL alone. The old primary, starting
# as a standby after its clean shutdown, saves its record stamped with that
# checkpoint and delivers it: the row becomes exact, 0 lost. A stamped
# record of another shutdown is refused, and a crash recovered in
# single-user mode (which ends with a shutdown checkpoint too) stamps
# nothing. Judged by the rows present.
use strict;
use warnings;
use File::Spec;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my %saved_dir = map { $_ => File::Spec->rel2abs(PostgreSQL::Test::Utils::tempdir("saved_$_")) } qw(a b);
my $node_a = new_dd_node('so_a', init => { allows_streaming => 1 },
	conf => "delayed_durability.crash_record_directory = '$saved_dir{a}'\n");
$node_a->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
CREATE TABLE t (k int PRIMARY KEY, xid xid8);
SELECT flush_log();
});
$node_a->backup('b');
my $node_b = PostgreSQL::Test::Cluster->new('so_b');
$node_b->init_from_backup($node_a, 'b', has_streaming => 1);
$node_b->append_conf('postgresql.conf', "delayed_durability.crash_record_directory = '$saved_dir{b}'\n");
$node_b->start;
$node_a->wait_for_catchup($node_b);

sub commit_with_receipts
{
	my ($node, $from, $to) = @_;
	my $out = $node->safe_psql('postgres', join('', map {
		"INSERT INTO t VALUES ($_, pg_current_xact_id());\nSELECT '$_ ' || last_commit_receipt();\n"
	} $from .. $to));
	return map { /^(\d+) (\S+)$/ ? ($1 => $2) : () } split /\n/, $out;
}

sub saved_files
{
	my ($dir) = @_;
	opendir my $dh, $dir or die "$dir: $!";
	my @files = sort grep { /\.commits/ } readdir $dh;
	closedir $dh;
	return @files;
}

# The old primary stops cleanly; its standby takes over. Returns the
# shutdown checkpoint's position (pg_controldata) and the failover row.
sub switchover
{
	my ($old, $new, $old_tli) = @_;
	$old->stop('fast');
	my $controldata = `pg_controldata -D '@{[ $old->data_dir ]}'`;
	my ($checkpoint) = $controldata =~ /^Latest checkpoint location:\s+(\S+)$/m or die "no checkpoint in:\n$controldata";
	like($controldata, qr/^Database cluster state:\s+shut down$/m, "timeline $old_tli: the old primary shut down cleanly");
	$new->poll_query_until('postgres', "SELECT pg_last_wal_replay_lsn() > '$checkpoint'")
	  or die 'the standby did not replay the shutdown checkpoint';
	$new->promote;
	$new->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'not promoted';
	$new->poll_query_until('postgres', "SELECT count(*) = 1 FROM delayed_durability_failovers WHERE old_timeline = $old_tli")
	  or die 'no failover row';
	return ($checkpoint, $new->safe_psql('postgres',
		"SELECT coalesce(lost_commits::text, 'null') || '|' || exact || '|' || detail FROM delayed_durability_failovers WHERE old_timeline = $old_tli"));
}

# The old primary starts as a standby of the new one; returns the row once
# its delivery made it exact.
sub rejoin
{
	my ($old, $new, $old_tli) = @_;
	my $offset = -s $old->logfile;
	$old->enable_streaming($new);
	$old->start;
	ok($new->poll_query_until('postgres', "SELECT exact FROM delayed_durability_failovers WHERE old_timeline = $old_tli"),
		"timeline $old_tli: the row becomes exact once the old primary rejoined");
	# Renamed after the answer: wait for its log line.
	$old->wait_for_log(qr/was delivered to the new primary/, $offset);
	return $new->safe_psql('postgres',
		"SELECT lost_commits || '|' || exact || '|' || detail FROM delayed_durability_failovers WHERE old_timeline = $old_tli");
}

# ---- A to B
my %receipt = commit_with_receipts($node_a, 1, 20);
is(scalar(keys %receipt), 20, 'twenty delayed commits acknowledged with their receipts');
my ($checkpoint_a, $row) = switchover($node_a, $node_b, 1);
is($node_b->safe_psql('postgres', 'SELECT count(*) FROM t WHERE k BETWEEN 1 AND 20'), '20',
	'switchover: every acknowledged delayed commit is on the new primary');
like($row, qr/^null\|false\|unknown: .*timeline 1 ends here with a shutdown checkpoint \(at \Q$checkpoint_a\E\): if it is the old primary's clean shutdown/,
	'switchover: before the old primary rejoins, the row is not exact and says its timeline ends with a shutdown checkpoint');

$row = rejoin($node_a, $node_b, 1);
like($row, qr/^0\|true\|exact: the old primary shut down cleanly at \Q$checkpoint_a\E, with the checkpoint timeline 1 ends with here/,
	'switchover: the old primary, rejoining as a standby, delivers its stamped record: 0 lost, exact');
ok($node_a->log_contains(qr/the record of the run that shut down cleanly at \Q$checkpoint_a\E is saved in/),
	'the old primary saved its record at its start as a standby');
my @a_files = saved_files($saved_dir{a});
is(scalar(grep { /\.commits\.delivered$/ } @a_files), 1, 'and it was delivered') or diag(join ', ', @a_files);
my @statuses = split /\n/, $node_b->safe_psql('postgres',
	'SELECT (receipt_status(r)).status FROM unnest(ARRAY[' . join(',', map { "'$_'" } values %receipt) . ']) AS r');
is(join(',', grep { $_ ne 'durable' } @statuses), '', 'every receipt reads durable on the new primary');

# ---- B back to A: the same, and a stamped record of another shutdown
# (A's, of timeline 1) is refused for it.
my %receipt_b = commit_with_receipts($node_b, 101, 110);
$node_b->safe_psql('postgres', 'SELECT flush_log()');
$node_b->wait_for_catchup($node_a);
my ($checkpoint_b, $row_b) = switchover($node_b, $node_a, 2);
is($node_a->safe_psql('postgres', 'SELECT count(*) FROM t WHERE k BETWEEN 101 AND 110'), '10',
	'switchover back: every acknowledged delayed commit is on A');
like($row_b, qr/^null\|false\|unknown: .*timeline 2 ends here with a shutdown checkpoint \(at \Q$checkpoint_b\E\)/,
	'switchover back: not exact before B rejoins');
my ($a_record) = grep { /\.commits\.delivered$/ } @a_files;
my $stale = "$saved_dir{a}/$a_record";
my (undef, undef, $err) = $node_a->psql('postgres', "SELECT delayed_durability_import_failover_record('$stale', 2)");
like($err, qr/every acknowledged commit in .* ends before the switch point/,
	'a record stamped with another shutdown (timeline 1) is refused for the failover from timeline 2');
is($node_a->safe_psql('postgres', 'SELECT coalesce(lost_commits::text, \'null\') || exact FROM delayed_durability_failovers WHERE old_timeline = 2'),
	'nullfalse', 'and the row is unchanged');
$row_b = rejoin($node_b, $node_a, 2);
like($row_b, qr/^0\|true\|exact: the old primary shut down cleanly at \Q$checkpoint_b\E, with the checkpoint timeline 2 ends with here/,
	'switchover back: B rejoins and delivers: 0 lost, exact');

# ---- A crashes and is recovered in single-user mode, as pg_rewind and
# Patroni do: that ends with a shutdown checkpoint, and pg_control says
# "shut down"; started as a standby then, it must stamp nothing (the run
# began with commits lost in the crash): its crashed run's record is the
# one to deliver.
commit_with_receipts($node_a, 201, 205);
kill_everything($node_a);
my ($out, $err_single) = ('', '');
IPC::Run::run([ 'postgres', '--single', '-F', '-c', 'archive_mode=off', '-D', $node_a->data_dir, 'template1' ],
	'<', \(my $no_input = ''), '>', \$out, '2>', \$err_single) or die "single-user recovery failed: $err_single";
like($err_single, qr/the record of the crashed run \(\d+ entries\) is saved/, 'single-user crash recovery saves the crashed run\'s record');
like(scalar(`pg_controldata -D '@{[ $node_a->data_dir ]}'`), qr/^Database cluster state:\s+shut down$/m,
	'after it pg_control says shut down');
my @before = saved_files($saved_dir{a});
my $log_offset = -s $node_a->logfile;
$node_a->enable_streaming($node_b);
$node_a->start;
$node_a->poll_query_until('postgres', 'SELECT pg_is_in_recovery()') or die 'A is not a standby';
ok(!$node_a->log_contains(qr/the record of the run that shut down cleanly/, $log_offset),
	'started as a standby after a single-user crash recovery, it stamps no record as a clean end');
is(join(',', saved_files($saved_dir{a})), join(',', @before), 'and saves nothing more: the crashed run\'s record stays the newest');

done_testing();
