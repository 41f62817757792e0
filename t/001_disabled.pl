# Mode disabled: every commit is durable, even with synchronous_commit = off.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('disabled');
$node->safe_psql('postgres', 'CREATE TABLE t (id int)');

my $n = 50;
my @flushed = commits_with_check($node, 'postgres', 'SET synchronous_commit = off;',
	[ map { "INSERT INTO t VALUES ($_);" } 1 .. $n ]);
is(scalar @flushed, $n, 'one check per commit');
is(count_true(@flushed), $n, 'synchronous_commit = off under disabled: WAL flushed past every commit');

# commit_delayed() is ignored too.
@flushed = commits_with_check($node, 'postgres', '',
	[ map { "BEGIN; SELECT commit_delayed(); INSERT INTO t VALUES ($_); COMMIT;" } 101 .. 120 ]);
is(count_true(@flushed), 20, 'commit_delayed() under disabled: every commit flushed');

# Without the policy, PostgreSQL's own asynchronous commit would leave the
# WAL behind: the same check bites when the mode allows it.
@flushed = commits_with_check($node, 'postgres',
	"SET delayed_durability.mode = 'allowed'; SET synchronous_commit = off;",
	[ map { "INSERT INTO t VALUES ($_);" } 201 .. 220 ]);
is(count_true(@flushed), 0, 'control: the same commits under allowed are not flushed');

power_cut($node);
is($node->safe_psql('postgres', 'SELECT count(*) FROM t WHERE id <= 120'), $n + 20,
	'every durable commit is present after a power cut');

my $stats = $node->safe_psql('postgres',
	"SELECT commits_durable, commits_delayed FROM delayed_durability_stats WHERE datname = 'postgres'");
is($stats, '0|0', 'counters start from zero after a restart');

$node->stop;
done_testing();
