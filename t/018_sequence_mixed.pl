# cached_nextval() mixed with native nextval() and setval() on the same
# sequences, from concurrent sessions, into unique columns: no duplicate,
# with or without a crash in the middle, in forced mode (every commit
# delayed); and a power cut, after which the sequence goes on at most one
# block past the last value handed out. A refill that read the sequence and wrote it back later lost a
# concurrent nextval()'s advance and handed its values out again.
use strict;
use warnings;
use IPC::Run;
use Time::HiRes qw(usleep);
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('seq_mixed', conf => "delayed_durability.mode = forced\n");
$node->safe_psql('postgres', q{
CREATE SEQUENCE q1 CACHE 1;
CREATE SEQUENCE q50 CACHE 50;
-- t_before: when the call that produced id started (epoch seconds).
CREATE TABLE u1 (id bigint PRIMARY KEY, who text, t_before float8);
CREATE TABLE u50 (id bigint PRIMARY KEY, who text, t_before float8);
-- Each setval(): its target and when it had returned.
CREATE TABLE setvals (seq text, target bigint, t_after float8);
});

my $dir = PostgreSQL::Test::Utils::tempdir();
my $now = q{SELECT extract(epoch FROM clock_timestamp()) AS t \gset};
my %scripts = (
	cached => "$now\nINSERT INTO u1 VALUES (cached_nextval('q1'), 'c', :t);\n"
	  . "$now\nINSERT INTO u50 VALUES (cached_nextval('q50'), 'c', :t);\n",
	native => "$now\nINSERT INTO u1 VALUES (nextval('q1'), 'n', :t);\n"
	  . "$now\nINSERT INTO u50 VALUES (nextval('q50'), 'n', :t);\n",
	# setval() far ahead of the sequence's stored last_value (which is at or
	# above every value handed out, native sessions' own caches included):
	# never backwards, since the other clients cannot draw a million values
	# in between. (nextval() + 1000000 would be: with CACHE 50 a session's
	# nextval() can return an old value from its own cache.) The setval()
	# clients take turns: two at once would read the same last_value and the
	# second would set the sequence back below what was handed out between.
	setval => "BEGIN;\nSELECT pg_advisory_xact_lock(18);\n"
	  . "INSERT INTO setvals SELECT 'q1', setval('q1', last_value + 1000000), extract(epoch FROM clock_timestamp()) FROM q1;\n"
	  . "INSERT INTO setvals SELECT 'q50', setval('q50', last_value + 1000000), extract(epoch FROM clock_timestamp()) FROM q50;\n"
	  . "COMMIT;\n",
);
for my $name (keys %scripts)
{
	open my $fh, '>', "$dir/$name.sql" or die $!;
	print $fh $scripts{$name};
	close $fh;
}

# pgbench with the three scripts (setval rarely); returns its harness.
sub start_pgbench
{
	my ($seconds, $out, $err) = @_;
	return IPC::Run::start(
		[
			'pgbench', '-n', '-c', '4', '-j', '2', '-T', $seconds,
			'-f', "$dir/cached.sql\@10", '-f', "$dir/native.sql\@10", '-f', "$dir/setval.sql\@1",
			'-h', $node->host, '-p', $node->port, 'postgres'
		],
		'>', $out, '2>', $err);
}

sub counts
{
	return $node->safe_psql('postgres', q{
SELECT (SELECT count(*) FILTER (WHERE who = 'c') FROM u1) || ' ' ||
       (SELECT count(*) FILTER (WHERE who = 'n') FROM u1) || ' ' ||
       (SELECT count(*) FILTER (WHERE who = 'c') FROM u50) || ' ' ||
       (SELECT count(*) FILTER (WHERE who = 'n') FROM u50)});
}

# 1. Concurrent, no crash.
my ($out, $err) = ('', '');
my $h = start_pgbench(10, \$out, \$err);
$h->finish;
is($h->result(0), 0, 'mixed clients: pgbench exits 0 (no client aborted)');
unlike($err, qr/duplicate key|aborted/, 'mixed clients: no duplicate key error');
like($out, qr/number of failed transactions: 0 /, 'mixed clients: no failed transaction');
my ($c1, $n1, $c50, $n50) = split / /, counts();
cmp_ok($c1, '>=', 200, "cached_nextval rows on CACHE 1 ($c1)");
cmp_ok($n1, '>=', 200, "nextval rows on CACHE 1 ($n1)");
cmp_ok($c50, '>=', 200, "cached_nextval rows on CACHE 50 ($c50)");
cmp_ok($n50, '>=', 200, "nextval rows on CACHE 50 ($n50)");
# No setval() was lost: a call that started after a setval() had returned
# got a value above its target (cached_nextval on both sequences; nextval
# on CACHE 1 only: with CACHE 50 a session keeps handing out its own cached
# values after another session's setval(), as PostgreSQL documents).
my $setvals = $node->safe_psql('postgres', 'SELECT count(*) FROM setvals');
cmp_ok($setvals, '>=', 10, "setval() calls ran ($setvals)");
is($node->safe_psql('postgres', q{
SELECT count(*) FROM (
  SELECT id, t_before, 'q1' AS seq FROM u1
  UNION ALL SELECT id, t_before, 'q50' FROM u50 WHERE who = 'c') AS v
  JOIN setvals AS s ON s.seq = v.seq AND v.t_before > s.t_after AND v.id <= s.target}), '0',
	'no setval() lost: every later call returned a value above its target');

# 2. The same with a crash (kill -9 of every server process) in the middle.
# A separate client records the cached_nextval() values it was handed:
# none of them may be handed out again after the restart.
# More statements than it can run before the crash.
my $n = 400000;
# A file, not standard input: the crash ends psql while it would be reading.
open my $fh, '>', "$dir/record.sql" or die $!;
print $fh "SELECT cached_nextval('q50');\n" for 1 .. $n;
close $fh;
my ($rec_out, $rec_err) = ('', '');
my $recorder = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $node->host, '-p', $node->port, '-d', 'postgres', '-f', "$dir/record.sql" ],
	'>', \$rec_out, '2>', \$rec_err);
($out, $err) = ('', '');
$h = start_pgbench(60, \$out, \$err);
# Crash once the clients have committed a few thousand more rows.
my $rows_at_start = $node->safe_psql('postgres', 'SELECT count(*) FROM u50');
for (1 .. 600)
{
	last if $node->safe_psql('postgres', 'SELECT count(*) FROM u50') >= $rows_at_start + 3000;
	usleep(50_000);
}
kill_everything($node);
$h->finish;
$recorder->finish;
like($err, qr/perhaps the backend died|server closed the connection/, 'pgbench lost its connections to the crash');
unlike($err, qr/duplicate key/, 'no duplicate key before the crash');
my @handed_out = grep { /^-?\d+$/ } split /\n/, $rec_out;
cmp_ok(scalar @handed_out, '>=', 100, 'recorder got values before the crash (' . scalar(@handed_out) . ')');
cmp_ok(scalar @handed_out, '<', $n, 'the crash interrupted the recorder');

$node->start;
my %before = map { $_ => 1 } @handed_out;
my @after = split /\n/, $node->safe_psql('postgres',
	"SELECT cached_nextval('q50') FROM generate_series(1, 500)");
is(scalar(grep { $before{$_} } @after), 0, 'no cached_nextval value handed out before the crash is handed out again');
my $max_before = (sort { $b <=> $a } @handed_out)[0];
cmp_ok((sort { $a <=> $b } @after)[0], '>', $max_before, 'after the crash cached_nextval continues above every value handed out');

($out, $err) = ('', '');
$h = start_pgbench(5, \$out, \$err);
$h->finish;
is($h->result(0), 0, 'after the crash: mixed clients run without aborting');
unlike($err, qr/duplicate key/, 'after the crash: no duplicate key');

# 3. A power cut, decided by strace (WAL never really synced is zeroed),
# while a client draws from a sequence only cached_nextval() uses, with
# every commit delayed: no value handed out before is handed out again, and
# the sequence goes on at most one block (CACHE 50) past the last value
# handed out: the recovery value written for the block in use.
$node->safe_psql('postgres', 'CREATE SEQUENCE qgap CACHE 50; SELECT flush_log();');
open $fh, '>', "$dir/gap.sql" or die $!;
print $fh "SELECT cached_nextval('qgap');\n" for 1 .. $n;
close $fh;
my $trace = start_fsync_trace($node);
($rec_out, $rec_err) = ('', '');
$recorder = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $node->host, '-p', $node->port, '-d', 'postgres', '-f', "$dir/gap.sql" ],
	'>', \$rec_out, '2>', \$rec_err);
usleep(1_500_000);
kill_everything($node);
stop_fsync_trace($trace);
$recorder->finish;
# (Each value's block was really synced before it was handed out, and the
# statements wrote no commit: there may be nothing unsynced to zero.)
zero_unsynced_wal($node, $trace);
@handed_out = grep { /^-?\d+$/ } split /\n/, $rec_out;
cmp_ok(scalar @handed_out, '>=', 100, 'the client got values before the power cut (' . scalar(@handed_out) . ')');
$node->start;
$max_before = (sort { $b <=> $a } @handed_out)[0];
my $next = $node->safe_psql('postgres', "SELECT cached_nextval('qgap')");
cmp_ok($next, '>', $max_before, "after the power cut cached_nextval continues above every value handed out ($max_before)");
# The kill can fall between the server drawing a value and the client
# reading it: the server may have drawn one value more than the client saw,
# and that value may have opened (and flushed the recovery value of) a new
# block. The bound is one block above that value.
my $drawn = $max_before + 1;
cmp_ok($next - $drawn, '<=', 50,
	"and at most one block (50) above the last value the server can have drawn ($drawn): " . ($next - $drawn));

$node->stop;
done_testing();
