# Failover and failback under synchronous replication: durable commits wait
# for the synchronous standby and are never lost nor reported lost; the
# delayed commits made after the last durable one are lost and listed
# exactly, from the old primary's record saved by its own crash recovery
# (crash_record_directory) before pg_rewind replaced its delayed_durability/:
# the old primary rejoins as a standby and delivers that record to the new
# primary by itself. A second failover back to it is reported the same way
# (the record imported by hand, its server gone), with every
# receipt of both rounds judged against the rows the last primary has. A
# third node follows the first promotion as a standby: promoted itself
# later, it records that one failover only.
use strict;
use warnings;
use File::Copy;
use File::Spec;
use IO::Select;
use IO::Socket::INET;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

# wal_keep_size: pg_rewind reads the old primary's WAL back to the last
# checkpoint before the timelines diverged; its crash recovery's checkpoint
# would otherwise recycle that segment.
# crash_record_directory: the start that finds a crashed run's record (here
# pg_rewind's single-user crash recovery) saves it there, out of pg_rewind's
# reach.
# (absolute: 18's test framework gives relative paths, which the setting refuses)
my $saved_dir = File::Spec->rel2abs(PostgreSQL::Test::Utils::tempdir('saved_records'));
my $node_a = new_dd_node('fb_a', init => { allows_streaming => 1 },
	conf => "wal_keep_size = 1GB\ndelayed_durability.crash_record_directory = '$saved_dir'\n");
$node_a->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'allowed';
CREATE TABLE t (k int PRIMARY KEY, durable bool NOT NULL);
SELECT flush_log();
});
$node_a->backup('b');
my $node_b = PostgreSQL::Test::Cluster->new('fb_b');
$node_b->init_from_backup($node_a, 'b', has_streaming => 1);
$node_b->start;
$node_a->wait_for_catchup($node_b);
my $node_c = PostgreSQL::Test::Cluster->new('fb_c');
$node_c->init_from_backup($node_a, 'b', has_streaming => 1);
$node_c->start;
$node_a->wait_for_catchup($node_c);

sub noted_timeline
{
	my ($node) = @_;
	my $file = $node->data_dir . '/delayed_durability/failovers';
	return -e $file && slurp_file($file) =~ /^timeline\t(\d+)$/m ? $1 : 'none';
}

my (%receipt, %is_durable);

# Commits $from..$to, one transaction each: even keys durable (they wait
# for the synchronous standby), odd keys delayed; then $tail delayed
# commits after the last durable one ($to, even).
# Records each receipt as the client hears of it.
sub commits
{
	my ($node, $from, $to, $tail) = @_;
	my $sql = '';
	for my $k ($from .. $to + $tail)
	{
		my $durable = ($k <= $to && $k % 2 == 0) ? 1 : 0;
		$is_durable{$k} = $durable;
		$sql .= $durable
		  ? "INSERT INTO t VALUES ($k, true);\n"
		  : "BEGIN; SELECT commit_delayed() \\g /dev/null\nINSERT INTO t VALUES ($k, false); COMMIT;\n";
		$sql .= "SELECT '$k ' || last_commit_receipt();\n";
	}
	my $out = $node->safe_psql('postgres', $sql);
	my %got = map { /^(\d+) (\S+)$/ ? ($1 => $2) : () } split /\n/, $out;
	die 'missing receipts' unless keys %got == $to + $tail - $from + 1;
	%receipt = (%receipt, %got);
	return map { $got{$_} } ($to + 1 .. $to + $tail);
}

sub receipt_end { return lsn_to_int((split /:/, $_[0])[2]) }

sub synchronous
{
	my ($primary, $standby_name) = @_;
	$primary->append_conf('postgresql.conf', "synchronous_standby_names = '$standby_name'\n");
	$primary->reload;
	$primary->poll_query_until('postgres',
		"SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = '$standby_name'")
	  or die "$standby_name is not synchronous";
}

# Checks, on the node that is primary now: the missing rows are exactly
# the expected ones of every round so far, no durable commit is missing,
# every receipt reads `durable` when its row is there and `lost` when not;
# the failover is recorded, not exact before the old primary's record comes.
sub judge_rows
{
	my ($node, $round, $old_tli, $new_tli, $expected_missing) = @_;
	my %present = map { $_ => 1 } split /\n/, $node->safe_psql('postgres', 'SELECT k FROM t');
	my @missing = grep { !$present{$_} } sort { $a <=> $b } keys %receipt;
	is(join(',', grep { $is_durable{$_} } @missing), '', "$round: no durable commit is missing");
	is(join(',', @missing), join(',', @$expected_missing), "$round: the delayed commits after the last durable one are missing, no other");
	my @wrong;
	for my $k (sort { $a <=> $b } keys %receipt)
	{
		my $status = $node->safe_psql('postgres', "SELECT status FROM receipt_status('$receipt{$k}')");
		push @wrong, "$k=$status" if $status ne ($present{$k} ? 'durable' : 'lost');
	}
	is(join(',', @wrong), '', "$round: every receipt of every round reads durable when its row is there, lost when not");
	$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM delayed_durability_failovers WHERE new_timeline = $new_tli")
	  or die 'no failover row';
	is($node->safe_psql('postgres',
		"SELECT old_timeline || ' ' || exact FROM delayed_durability_failovers WHERE new_timeline = $new_tli"),
		"$old_tli false", "$round: the failover from timeline $old_tli is recorded, not exact yet");
}

# The old primary's record, imported by hand on the node that is primary now.
sub import_record
{
	my ($node, $round, $old_tli, $record, $expected_lost) = @_;
	my $copy = File::Spec->rel2abs($node->basedir . "/record_of_timeline_$old_tli");
	copy($record, $copy) or die "copy: $!";
	is($node->safe_psql('postgres', "SELECT delayed_durability_import_failover_record('$copy', $old_tli)"),
		scalar(@$expected_lost), "$round: the import lists as many as are missing");
}

# The old primary's record, however it came, lists exactly the ones this
# failover lost, by xid and commit position; the failover row is exact.
sub judge_listed
{
	my ($node, $round, $new_tli, $expected_lost) = @_;
	my @listed = split /\n/, $node->safe_psql('postgres',
		"SELECT xid || ' ' || commit_lsn FROM delayed_durability_lost_commits l JOIN delayed_durability_failovers f
		  ON f.failover_at = l.crash_recovered_at WHERE l.lost_in = 'failover' AND f.new_timeline = $new_tli ORDER BY commit_lsn");
	my @expected = map { my @f = split /:/, $receipt{$_}; "$f[3] $f[2]" } @$expected_lost;
	is_deeply(\@listed, \@expected, "$round: listed are exactly the missing ones, by xid and commit position (no durable one)");
	is($node->safe_psql('postgres', "SELECT exact FROM delayed_durability_failovers WHERE new_timeline = $new_tli"), 't',
		"$round: the failover row is exact");
}

# ---- round 1: A primary, B its synchronous standby. A's WAL writer is
# stopped: only the durable commits flush. B's report worker samples what
# it hears from A every second: A dies after it had time to.
synchronous($node_a, 'fb_b');
pause_wal_writer($node_a);
# B samples what it hears once a second: let it sample before the commits,
# so that a row quoting a stale sample would quote a position before the
# last durable commit (and fail below).
select(undef, undef, undef, 2.5);
my @tail = commits($node_a, 1, 20, 6);
my $flushed = lsn_to_int($node_a->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
select(undef, undef, undef, 2.5);
ok($flushed < receipt_end($tail[0]), 'round 1: the last six delayed commits are not flushed when the primary dies')
  or diag("flushed $flushed, first of the six ends at " . receipt_end($tail[0]));
kill_everything($node_a);
$node_b->promote;
$node_b->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'B not promoted';

# ---- A rewound against B, as Patroni does when the old primary comes
# back: nobody copied A's record first. pg_rewind runs A's crash recovery
# (single-user, the library preloaded), then replaces A's
# delayed_durability/ with B's; the record was saved before.
# B records the failover first (pg_rewind then brings that record to A).
$node_b->poll_query_until('postgres', 'SELECT count(*) = 1 FROM delayed_durability_failovers WHERE new_timeline = 2')
  or die 'no failover row on B';
# pg_rewind reads the source's timeline from its last checkpoint.
$node_b->safe_psql('postgres', 'CHECKPOINT');
# pg_rewind copies the source's configuration: keep A's, without the
# synchronous standby it named.
my $conf = slurp_file($node_a->data_dir . '/postgresql.conf');
my ($rc, $out, $err) = (0, '', '');
IPC::Run::run([ 'pg_rewind', '--target-pgdata', $node_a->data_dir, '--source-server', $node_b->connstr('postgres') ],
	'>', \$out, '2>', \$err) or $rc = $?;
is($rc, 0, 'pg_rewind of the old primary A succeeds') or diag("$out$err");
like($err, qr/the record of the crashed run \(\d+ entries\) is saved in "\Q$saved_dir\E\//,
	'its crash recovery saved the record of the crashed run, and logged where');
opendir(my $dh, $saved_dir) or die $!;
my @saved = grep { /^delayed_durability-\d+-p\d+-\d+-\d+-tl1\.commits$/ } readdir $dh;
closedir $dh;
is(scalar @saved, 1, 'one saved record, outside the data directory, named with the timeline it was written on');
# Before any import, the row says what B last heard of A's flushed WAL:
# at least the last durable commit (B confirmed it), not the unflushed tail.
my $detail = $node_b->safe_psql('postgres', 'SELECT detail FROM delayed_durability_failovers WHERE new_timeline = 2');
my ($heard) = $detail =~ /had flushed its WAL at least up to ([0-9A-F]+\/[0-9A-F]+)/;
ok(defined $heard && lsn_to_int($heard) >= receipt_end($receipt{20}) && lsn_to_int($heard) < receipt_end($tail[0]),
	'without the record, the failover row says how far the old primary had flushed: past the last durable commit, before the delayed tail')
  or diag($detail);
judge_rows($node_b, 'failover to B', 1, 2, [ 21 .. 26 ]);

# C, a standby of A, now follows B on timeline 2: it notes that timeline
# (its record of the failover stays on B, the server promoted then).
for (1 .. 100) { last if noted_timeline($node_c) eq '1'; select(undef, undef, undef, 0.1); }
die 'the standby C did not note timeline 1 while following A' unless noted_timeline($node_c) eq '1';
$node_c->enable_streaming($node_b);
# A crash record directory inside the data directory (which pg_rewind and
# re-clones empty) is refused at start, not at the crash that needs it.
my $inside = File::Spec->rel2abs($node_c->data_dir . '/saved_here');
mkdir $inside;
$node_c->append_conf('postgresql.conf', "delayed_durability.crash_record_directory = '$inside'\n");
$node_c->restart;
ok($node_c->log_contains(qr/WARNING:  delayed_durability.crash_record_directory ".*saved_here" is inside the data directory/),
	'a crash record directory inside the data directory: refused with a WARNING at start');
$node_b->wait_for_catchup($node_c);
my $noted = 'none';
for (1 .. 100)
{
	$noted = noted_timeline($node_c);
	last if $noted eq '2';
	select(undef, undef, undef, 0.1);
}
is($noted, '2', 'C, following B, notes timeline 2 without recording a failover');
is($node_c->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_failovers'), '0',
	'C shows no failover while it is a standby');

# ---- A, rewound, rejoins as B's standby.
# First its delivery goes to a server that accepts the connection and
# never answers (connect_timeout = 0: libpq would wait for ever): the wait
# must not keep A from stopping, nor use the record up.
my $silent = IO::Socket::INET->new(Listen => 5, LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp', ReuseAddr => 1)
  or die "listen: $!";
my $silent_port = $silent->sockport;
my $delivery_line = "delayed_durability.delivery_conninfo = 'host=127.0.0.1 port=$silent_port dbname=postgres connect_timeout=0'\n";
open my $conf_fh, '>', $node_a->data_dir . '/postgresql.conf' or die $!;
print $conf_fh $conf, "synchronous_standby_names = ''\n", $delivery_line;
close $conf_fh;
$node_a->enable_streaming($node_b);
$node_a->start;
my $peer;
$peer = $silent->accept if IO::Select->new($silent)->can_read($PostgreSQL::Test::Utils::timeout_default);
ok(defined $peer, 'the rejoined old primary connects to deliver its record (to a server that never answers)');
ok($node_a->stop('fast', fail_ok => 1), 'it stops while its delivery waits for that server (a fast shutdown)');
close $peer if $peer;
close $silent;
opendir(my $sdh, $saved_dir) or die $!;
is(scalar(grep { $_ eq $saved[0] } readdir $sdh), 1, 'the record given up by the stop is kept, to be delivered later');
closedir $sdh;
my $conf_a = slurp_file($node_a->data_dir . '/postgresql.conf');
$conf_a =~ s/\Q$delivery_line\E//;
open $conf_fh, '>', $node_a->data_dir . '/postgresql.conf' or die $!;
print $conf_fh $conf_a;
close $conf_fh;
$node_a->start;
$node_b->wait_for_catchup($node_a);
my @wrong_on_standby;
my %present_b = map { $_ => 1 } split /\n/, $node_b->safe_psql('postgres', 'SELECT k FROM t');
for my $k (sort { $a <=> $b } keys %receipt)
{
	my ($status, $detail) = split /\|/, $node_a->safe_psql('postgres', "SELECT status, detail FROM receipt_status('$receipt{$k}')");
	push @wrong_on_standby, "$k=$status ($detail)" if $status ne ($present_b{$k} ? 'durable' : 'lost');
}
is(join(',', @wrong_on_standby), '', 'on the rejoined old primary (a standby now) the receipts read as on the new primary');
opendir($dh, $saved_dir) or die $!;
is(scalar(grep { /\.commits(\.delivered)?$/ } readdir $dh), 1,
	'the rewound server\'s start saved nothing more (the record pg_rewind brought is the new primary\'s)');
closedir $dh;

# A, streaming from B, delivers its saved record to B by itself (its
# primary_conninfo, database postgres): B's failover row becomes exact.
ok($node_b->poll_query_until('postgres', 'SELECT exact FROM delayed_durability_failovers WHERE new_timeline = 2'),
	'the rejoined old primary delivers its saved record: the failover row on the new primary becomes exact by itself');
judge_listed($node_b, 'failover to B (the record delivered by A)', 2, [ 21 .. 26 ]);
like($node_b->safe_psql('postgres', 'SELECT detail FROM delayed_durability_failovers WHERE new_timeline = 2'),
	qr/^exact: 6 acknowledged delayed commits .* \(imported from the record delivered by .* port \d+ \(\Q$saved[0]\E\) as \S+\)$/,
	'the failover row names the server, the file and the role the record came from');
ok(-f "$saved_dir/" . ($saved[0] =~ s/\.commits$/.commits.delivered/r) && !-e "$saved_dir/$saved[0]",
	'the delivered record is renamed .commits.delivered (not delivered again)');
ok($node_a->log_contains(qr/the record of the crashed run was delivered to the new primary, which lists 6 acknowledged delayed commits as lost/),
	'the old primary logs the delivery and what the new primary listed');
is($node_a->safe_psql('postgres', 'SELECT count(*) FROM t'), $node_b->safe_psql('postgres', 'SELECT count(*) FROM t'),
	'the rejoined old primary has the new primary\'s rows');

# ---- round 2: B primary, A its synchronous standby; B dies; A promoted.
synchronous($node_b, 'fb_a');
@tail = commits($node_b, 101, 120, 6);
$flushed = lsn_to_int($node_b->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
ok($flushed < receipt_end($tail[0]), 'round 2: the last six delayed commits are not flushed when the primary dies')
  or diag("flushed $flushed, first of the six ends at " . receipt_end($tail[0]));
is($node_b->safe_psql('postgres', "SELECT delayed_commits FROM delayed_durability_standby_exposure WHERE application_name = 'fb_a'"),
	'6', 'round 2: before it dies, the primary counts six commits a promotion of A would lose');
my $record_b = $node_b->data_dir . '/delayed_durability/commits';
kill_everything($node_b);
my $saved_b = File::Spec->rel2abs($node_a->basedir . '/saved_record_b');
copy($record_b, $saved_b) or die "copy: $!";
$node_a->promote;
$node_a->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'A not promoted';
judge_rows($node_a, 'failback to A', 2, 3, [ 21 .. 26, 121 .. 126 ]);
import_record($node_a, 'failback to A', 2, $saved_b, [ 121 .. 126 ]);
judge_listed($node_a, 'failback to A', 3, [ 121 .. 126 ]);
is($node_a->safe_psql('postgres', 'SELECT string_agg(old_timeline || \'->\' || new_timeline, \',\' ORDER BY new_timeline) FROM delayed_durability_failovers'),
	'1->2,2->3', 'A shows both failovers of the database system (the first one came with pg_rewind)');
# The first failover's row came to A with pg_rewind, from B, before A
# delivered its record there: it waited on A. A's promotion gives it A's own
# saved record of timeline 1 (delivered since): A lists what B lists.
judge_listed($node_a, 'the first failover, on A', 2, [ 21 .. 26 ]);
like($node_a->safe_psql('postgres', 'SELECT detail FROM delayed_durability_failovers WHERE new_timeline = 2'),
	qr/^exact: 6 acknowledged delayed commits .* \(imported from this server's own saved record "[^"]*\Q$saved[0]\E\.delivered"\)$/,
	'the first failover\'s row on A names A\'s own saved record');

# C, cut off with B, promoted too: it records the failover from timeline 2
# only, not again the one from timeline 1 it followed as a standby.
$node_c->promote;
$node_c->poll_query_until('postgres', 'SELECT count(*) >= 1 FROM delayed_durability_failovers') or die 'no failover row on C';
is($node_c->safe_psql('postgres', 'SELECT string_agg(old_timeline || \'->\' || new_timeline, \',\') FROM delayed_durability_failovers'),
	'2->3', 'C, promoted, records one failover: from the timeline it followed last');
$node_c->stop;

# ---- A, the primary on timeline 3, crashes and comes back as the primary
# on that timeline: it reports that crash itself, so the record its start
# saved (named with timeline 3) is renamed .reported and never delivered.
$node_a->safe_psql('postgres', "BEGIN; SELECT commit_delayed() \\g /dev/null\nINSERT INTO t VALUES (500, false); COMMIT;");
kill_everything($node_a);
$node_a->start;
my @reported;
for (1 .. 300)
{
	opendir($dh, $saved_dir) or die $!;
	@reported = grep { /-tl3\.commits(\.reported)?$/ } readdir $dh;
	closedir $dh;
	last if @reported == 1 && $reported[0] =~ /\.reported$/;
	select(undef, undef, undef, 0.1);
}
like(join(',', @reported), qr/^delayed_durability-\d+-p\d+-\d+-\d+-tl3\.commits\.reported$/,
	'a crash of the primary it comes back from as the primary: its saved record is marked reported, never delivered');

$node_a->stop;
done_testing();
