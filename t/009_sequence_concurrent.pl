# cached_nextval() from concurrent sessions: all values distinct, and handed
# out in call order (a call that returned before another started got the
# smaller value).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('sequence_concurrent');
$node->safe_psql('postgres', q{
CREATE SEQUENCE s CACHE 50;
CREATE SEQUENCE s_down INCREMENT -1 MINVALUE -100000000 MAXVALUE 0 CACHE 7;
CREATE TABLE seq_log (t0 timestamptz, v bigint, t1 timestamptz);
CREATE TABLE seq_log_down (t0 timestamptz, v bigint, t1 timestamptz);
});

$node->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=500',
	0,
	[qr{processed: 2000/2000}],
	[qr{^$}],
	'4 concurrent clients call cached_nextval()',
	{
		'seq_log' => q{
INSERT INTO seq_log SELECT t0, v, clock_timestamp()
  FROM (SELECT clock_timestamp() AS t0, cached_nextval('s') AS v OFFSET 0) AS call;
INSERT INTO seq_log_down SELECT t0, v, clock_timestamp()
  FROM (SELECT clock_timestamp() AS t0, cached_nextval('s_down') AS v OFFSET 0) AS call;
}
	});

for my $table ('seq_log', 'seq_log_down')
{
	my $order = $table eq 'seq_log' ? 'ASC' : 'DESC';
	is($node->safe_psql('postgres', "SELECT count(*), count(DISTINCT v) FROM $table"), '2000|2000',
		"$table: all values distinct");
	# In value order, no call may have returned before an earlier-valued
	# call started.
	my $violations = $node->safe_psql('postgres', qq{
SELECT count(*) FROM (
  SELECT t1, max(t0) OVER (ORDER BY v $order ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS started_before
    FROM $table) AS x
 WHERE t1 < started_before});
	is($violations, '0', "$table: values handed out in call order across sessions");
}
# One cache shared by all sessions, no per-session blocks: the values are
# nearly dense. A call that races a block claim skips the value it counted
# (a gap, never a repeat), so a few gaps are allowed; per-session blocks of
# 50 would leave hundreds.
my $span = $node->safe_psql('postgres', 'SELECT max(v) - min(v) + 1 FROM seq_log');
cmp_ok($span, '>=', 2000, 'seq_log: span covers every value');
cmp_ok($span, '<', 2050, 'seq_log: at most a few gaps (one cache shared by all sessions)');

$node->stop;
done_testing();
