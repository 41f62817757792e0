# cached_nextval() never hands out a value twice across a power cut, even
# with every commit delayed: each block's recovery value is flushed before
# any of its values is handed out. Native nextval() under asynchronous
# commit is the companion: the same power cut makes it go backwards.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('sequence_crash', conf => "delayed_durability.mode = 'forced'\n");
$node->safe_psql('postgres', q{
CREATE SEQUENCE c1 CACHE 1;
CREATE SEQUENCE c50 CACHE 50;
CREATE SEQUENCE c10000 CACHE 10000;
CREATE SEQUENCE native CACHE 1;
SELECT flush_log();
});

# Several concurrent client sessions, each statement its own (delayed)
# transaction; every value the clients print is a value they received.
sub hand_out
{
	my ($seq, $sessions, $statements, $per_statement) = @_;
	my (@runs, @outs, @errs);
	for my $s (1 .. $sessions)
	{
		my $script = join("\n",
			("SELECT cached_nextval('$seq') FROM generate_series(1, $per_statement);") x $statements) . "\n";
		my ($out, $err) = ('', '');
		push @outs, \$out;
		push @errs, \$err;
		push @runs, IPC::Run::start(
			[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-f', '-' ],
			'<', \$script, '>', \$out, '2>', \$err);
	}
	$_->finish for @runs;
	my @values = map { split /\n/, $$_ } @outs;
	is(join('', map { $_->result(0) } @runs) . join('', map { $$_ } @errs), '0' x $sessions,
		"$seq: every client exited 0 without error output");
	is(scalar @values, $sessions * $statements * $per_statement, "$seq: every client got all its values");
	return @values;
}

# The simulated power cut: every process killed, WAL past the flush
# position (read once the clients are done) zeroed.
sub power_cut
{
	my $flushed_at = lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
	kill_everything($node);
	zero_wal_after($node, $flushed_at);
	$node->start;
}

my %received;
for my $round (1 .. 2)
{
	for my $seq ('c1', 'c50', 'c10000')
	{
		my @values = hand_out($seq, 3, 10, $seq eq 'c1' ? 20 : 100);
		push @{ $received{$seq} }, @values;
	}
	power_cut();
}
for my $seq ('c1', 'c50', 'c10000')
{
	push @{ $received{$seq} }, hand_out($seq, 2, 5, 50);
	my %seen;
	my @dups = grep { $seen{$_}++ } @{ $received{$seq} };
	is(scalar @dups, 0, "$seq: no value handed out twice across two crashes ("
		  . scalar(@{ $received{$seq} }) . ' values)');
	cmp_ok(scalar(keys %seen), '>=', 1000, "$seq: values were handed out");
}

# The recovery value is flushed even though every commit is delayed.
$node->safe_psql('postgres', 'CREATE SEQUENCE fresh CACHE 50');
my ($flush_ok) = $node->safe_psql('postgres', q{
BEGIN;
SELECT pg_current_wal_flush_lsn() < wal_end() AS unflushed_before;
SELECT cached_nextval('fresh');
SELECT pg_current_wal_flush_lsn() >= wal_end() AS flushed_after;
COMMIT;
}) =~ /^t\n1\nt$/ ? ('t') : ('f');
is($flush_ok, 't', 'a cache refill flushes the WAL under forced mode');

# Companion: native nextval() under asynchronous commit goes backwards
# across the same power cut (its WAL-logged advance was never flushed).
settle_wal_writer($node);
my $before = $node->safe_psql('postgres',
	"SELECT max(v) FROM (SELECT nextval('native') AS v FROM generate_series(1, 500)) s");
power_cut();
my $after = $node->safe_psql('postgres', "SELECT nextval('native')");
cmp_ok($after, '<=', $before,
	"PostgreSQL hazard reproduced: native nextval returned $after after handing out up to $before");

$node->stop;
done_testing();
