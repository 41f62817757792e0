# The record of acknowledged delayed commits, when its file is damaged or
# cannot be written: a crash is never left unreported, a report is never
# more confident than its record, and the record is recreated. Each case
# commits delayed rows (client's own log of xids), crashes, damages the
# record, starts, and reads the crash report.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('record', init => { allows_streaming => 1 }, conf => "delayed_durability.lost_commits_ring_size = 64\nrestart_after_crash = on\n");
$node->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
CREATE TABLE acked (xid xid8 PRIMARY KEY);
});
my $dir = $node->data_dir . '/delayed_durability';
my $ring = "$dir/commits";

sub commit_delayed_rows
{
	my ($n) = @_;
	my $out = $node->safe_psql('postgres',
		join('', map { "INSERT INTO acked SELECT pg_current_xact_id() RETURNING 'xid=' || xid;\n" } 1 .. $n));
	return $out =~ /xid=(\d+)/g;
}

sub now { return $node->safe_psql('postgres', 'SELECT clock_timestamp()'); }

sub crash_row
{
	my ($since) = @_;
	$node->poll_query_until('postgres', "SELECT count(*) > 0 FROM delayed_durability_crashes WHERE crash_recovered_at > '$since'")
	  or return 'no row';
	return $node->safe_psql('postgres',
		"SELECT coalesce(lost_commits::text, 'NULL'), exact, detail FROM delayed_durability_crashes WHERE crash_recovered_at > '$since' ORDER BY crash_recovered_at");
}

sub listed
{
	my ($since) = @_;
	return sort split /\n/, $node->safe_psql('postgres', "SELECT xid FROM delayed_durability_lost_commits WHERE crash_recovered_at > '$since'");
}

# Delayed commits, every process killed and unflushed WAL zeroed (so some
# acknowledged commits are really lost), the record changed by $damage,
# start. Returns the time before the crash and the lost xids.
sub crash_with_damaged_record
{
	my ($damage) = @_;
	settle_wal_writer($node);
	$node->safe_psql('postgres', 'SELECT flush_log()');
	my @acked = commit_delayed_rows(5);
	my $since = now();
	my $flushed_at = lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
	kill_everything($node);
	zero_wal_after($node, $flushed_at);
	$damage->();
	$node->start;
	my %present = map { $_ => 1 } split /\n/, $node->safe_psql('postgres', 'SELECT xid FROM acked');
	return ($since, grep { !$present{$_} } @acked);
}

# After each damaged case, the record must be whole again: the next crash
# is reported exactly.
sub next_crash_is_exact
{
	my ($case) = @_;
	my ($since, @lost) = crash_with_damaged_record(sub { });
	like(crash_row($since), qr/^5\|t\|exact: 5 of \d+ /, "$case: the record is recreated (the next crash is exact)");
	is_deeply([ listed($since) ], [ sort @lost ], "$case: and lists the lost commits");
}

# kill -9 of one child (the WAL writer): the postmaster restarts every
# process (a crash restart, the postmaster's memory kept).
sub kill_wal_writer
{
	my $pid = $node->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
	kill 'KILL', $pid or die "kill $pid: $!";
	$node->poll_query_until('postgres', "SELECT pid <> $pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
	  or die 'no crash restart';
}

my $entries_offset;
{
	# The header's size: a record of capacity 64 is the header plus 64 entries of 64 bytes.
	$entries_offset = (-s $ring) - 64 * 64;
}

# ---- a 0-byte file (ENOSPC at creation, a postmaster killed before sizing it)
my ($since, @lost) = crash_with_damaged_record(sub { truncate $ring, 0 or die $! });
is(scalar @lost, 5, '5 acknowledged commits lost');
like(crash_row($since), qr/^NULL\|f\|unknown: the record file "[^"]*commits" was too short \(0 bytes\)/,
	'an empty record file: unknown, naming the reason');
ok(-e "$ring.damaged", 'the damaged file is kept aside');
next_crash_is_exact('empty file');

# ---- a truncated file: the entries still there are compared
($since, @lost) = crash_with_damaged_record(sub { truncate $ring, $entries_offset + 64 * 3 or die $! });
is(scalar @lost, 5, '5 acknowledged commits lost');
like(crash_row($since), qr/^NULL\|f\|unknown: the record file "[^"]*" is truncated .*its readable entries were compared; the (\d+) listed are certainly lost/,
	'a truncated record file: unknown, naming the reason');
my @listed = listed($since);
cmp_ok(scalar @listed, '<=', 3, 'at most the 3 readable entries listed');
my %lost = map { $_ => 1 } @lost;
is(join(',', grep { !$lost{$_} } @listed), '', 'each one listed was lost');
next_crash_is_exact('truncated file');

# ---- a corrupted header
($since, @lost) = crash_with_damaged_record(sub {
	open my $fh, '+<:raw', $ring or die $!;
	print $fh 'NOTARING';
	close $fh;
});
like(crash_row($since), qr/^NULL\|f\|unknown: the record file "[^"]*" is not a record of acknowledged commits/,
	'a record file with a corrupted header: unknown, naming the reason');
next_crash_is_exact('corrupted header');

# ---- a missing file after a crash
($since, @lost) = crash_with_damaged_record(sub { unlink $ring or die $! });
like(crash_row($since), qr/^NULL\|f\|unknown: the record file "[^"]*" was missing after the crash/,
	'a record file missing after a crash: unknown');
next_crash_is_exact('missing file');

# ---- an unwritable directory: the record cannot be created and the crash's
# row cannot be written to disk. The server runs without the record; a crash
# is still reported (from the postmaster's memory), and once the directory
# is writable again the rows reach the report and the record is recreated.
$node->stop;
unlink $ring;
chmod 0500, $dir or die $!;
$node->start;
ok($node->log_contains(qr/no record of acknowledged delayed commits: could not map/), 'the missing record is logged');
settle_wal_writer($node);
commit_delayed_rows(3);
$since = now();
kill_wal_writer();
like(crash_row($since), qr/^NULL\|f\|unknown: the record could not be kept: .*its row could not be written to "delayed_durability\/pending": .*Permission denied/,
	'a crash while the record could not be kept: unknown, from memory');
chmod 0700, $dir or die $!;
# The next crash writes both rows, and finds a writable directory.
my $since2 = now();
kill_wal_writer();
$node->poll_query_until('postgres', "SELECT count(*) > 0 FROM delayed_durability_crashes WHERE crash_recovered_at > '$since2' AND detail NOT LIKE '%could not be written%'")
  or die 'no report of the second crash';
ok(-s "$dir/lost", 'the report is on disk');
like($node->safe_psql('postgres', "SELECT string_agg(detail, ' // ' ORDER BY crash_recovered_at) FROM delayed_durability_crashes WHERE crash_recovered_at > '$since'"),
	qr/unknown: the record could not be kept.*Permission denied.* \/\/ unknown: the record could not be kept/,
	'the remembered crash and the next one (still without a record) are in the report');
next_crash_is_exact('unwritable directory');

# A second episode of the same (rows remembered in memory get ids that no
# earlier report row has).
$node->stop;
unlink $ring;
chmod 0500, $dir or die $!;
$node->start;
commit_delayed_rows(2);
$since = now();
kill_wal_writer();
like(crash_row($since), qr/unknown: the record could not be kept: .*Permission denied/, 'second episode: reported from memory');
chmod 0700, $dir or die $!;
$since2 = now();
kill_wal_writer();
$node->poll_query_until('postgres', "SELECT count(*) >= 2 FROM delayed_durability_crashes WHERE crash_recovered_at > '$since'")
  or die 'the remembered crash of the second episode was not reported';
is($node->safe_psql('postgres', "SELECT count(*) FROM delayed_durability_crashes WHERE crash_recovered_at > '$since' AND detail LIKE '%could not be written%'"),
	'1', 'second episode: the remembered crash reached the report');

# ---- a crashed primary restarted as a standby (what HA tools do): its
# acknowledged delayed commits cannot be compared with the WAL it will
# replay (another server's): reported unknown at once, with how many its
# record held, never silently dropped.
settle_wal_writer($node);
$node->safe_psql('postgres', 'SELECT flush_log()');
commit_delayed_rows(4);
$since = now();
kill_everything($node);
$node->append_conf('postgresql.conf', "primary_conninfo = 'host=/nonexistent port=1'\n");
$node->set_standby_mode;
my $log_at = -s $node->logfile;
$node->start;
like(crash_row($since), qr/^NULL\|f\|unknown: the server restarted as a standby or was rewound by pg_rewind .*its record held \d+ acknowledged delayed commits/,
	'a crashed primary restarted as a standby: unknown, with what its record held');
# Without crash_record_directory nothing keeps the record for a failover's
# list: said at the start, not left to be found out.
like(substr(slurp_file($node->logfile), $log_at),
	qr/WARNING:  delayed_durability: the record of the crashed run \([1-9]\d* acknowledged delayed commits\) is not kept: delayed_durability.crash_record_directory is not set/,
	'a crashed primary restarted as a standby without crash_record_directory: a WARNING says its record is not kept');
$node->promote;
$node->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die;

# ---- crash recovery in a single-user backend (wraparound repair, or
# pg_rewind's): the next normal start cannot compare it any more, and says so.
settle_wal_writer($node);
$node->safe_psql('postgres', 'SELECT flush_log()');
commit_delayed_rows(3);
$since = now();
kill_everything($node);
my ($single_out, $single_err) = ('', '');
IPC::Run::run([ 'postgres', '--single', '-D', $node->data_dir, 'postgres' ], '<', \'', '>', \$single_out, '2>', \$single_err)
  or diag("single-user: $single_out $single_err");
$node->start;
like(crash_row($since), qr/^NULL\|f\|unknown: the server restarted before the comparison could run/,
	'a crash recovered in single-user mode: unknown at the next start');

# ---- the report's own files unreadable (permissions, an I/O error, bytes
# that are not text): the views fail with an error, never show an empty
# report, and the next crash moves the file aside (WARNING) instead of
# writing over it.
my $report_file = "$dir/lost";
my $crashes_before = $node->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_crashes');
cmp_ok($crashes_before, '>', 0, 'crashes are reported');
chmod 0000, $report_file or die $!;
for my $view ('delayed_durability_crashes', 'delayed_durability_lost_commits')
{
	my ($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT count(*) FROM $view");
	like($err, qr/ERROR:  58030: could not read the crash report "delayed_durability\/lost": Permission denied/,
		"an unreadable crash report: $view fails with SQLSTATE 58030, not an empty report");
}
my $log_from = -s $node->logfile;
my ($since, @lost) = crash_with_damaged_record(sub { });
like(crash_row($since), qr/^5\|t\|exact: 5 of \d+ /, 'the next crash is reported exactly, in a new report');
like(substr(slurp_file($node->logfile), $log_from),
	qr/WARNING:  delayed_durability: "delayed_durability\/lost" could not be read \(Permission denied.*\); it was moved to "delayed_durability\/lost.damaged"/,
	'with a WARNING that the unreadable report was moved aside');
chmod 0600, "$report_file.damaged" or die $!;
is(scalar(() = slurp_file("$report_file.damaged") =~ /^crash\t/mg), $crashes_before, 'which kept every crash it held');
is($node->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_crashes'), '1', 'the new report holds the new crash only');

my $failover_file = "$dir/failovers";
ok(-f $failover_file, 'the failover history file exists (the timeline this server runs on)');
chmod 0000, $failover_file or die $!;
my ($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT count(*) FROM delayed_durability_failovers");
like($err, qr/ERROR:  58030: could not read the failover history "delayed_durability\/failovers": Permission denied/,
	'an unreadable failover history: the view fails with SQLSTATE 58030');
$log_from = -s $node->logfile;
$node->restart;
# Which timeline it ran on went with the file: the promotion to the one it
# runs on (earlier in this test) is recorded again rather than missed.
$node->poll_query_until('postgres',
	'SELECT count(*) = 1 AND bool_and(new_timeline = (SELECT timeline_id FROM pg_control_checkpoint())) FROM delayed_durability_failovers')
  or diag('failovers: ' . ($node->psql('postgres', 'SELECT * FROM delayed_durability_failovers'))[2]);
like(substr(slurp_file($node->logfile), $log_from),
	qr/WARNING:  delayed_durability: "delayed_durability\/failovers" could not be read \(Permission denied.*\); it was moved to "delayed_durability\/failovers.damaged"/,
	'the next start moves it aside with a WARNING');
is($node->safe_psql('postgres', 'SELECT old_timeline + 1 = new_timeline FROM delayed_durability_failovers'), 't',
	'and the view works again, the promotion to this timeline recorded again rather than missed');

$node->stop;
done_testing();
