# The experiment runner at a tiny scale: the report has every table and
# chart, and its numbers are internally consistent.
use strict;
use warnings;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $work = $ENV{REPO_WORK} or plan skip_all => 'REPO_WORK not set (run through scripts/test.sh)';
my $out = PostgreSQL::Test::Utils::tempdir('report');
my $port = PostgreSQL::Test::Cluster::get_free_port();
my ($stdout, $stderr);
my $ok = IPC::Run::run([ '/usr/bin/python3', "$work/pgbench/run.py", '--scale', 'tiny', '--out', $out,
		'--port', $port ], '>', \$stdout, '2>', \$stderr);
ok($ok, 'runner finished') or diag("stdout:\n$stdout\nstderr:\n$stderr");
like($stdout, qr/exp 2: permanent table, durable/, 'progress shows experiment and row');

my $report = slurp_file("$out/report.md");
my $results = decode_json(slurp_file("$out/results.json"));
my %r = %{ $results->{results} };

for my $title ('1. Loop of single-row inserts', '2. Small vs big transactions', '3. Sequences',
	'4. Concurrent workload', '5. Persistent WAL buffer', '6. WAL segment size')
{
	like($report, qr/^## \Q$title\E/m, "report has table: $title");
}
for my $id (sort keys %r)
{
	my $png = "$out/experiment$id.png";
	ok(-s $png > 5000, "chart for experiment $id exists");
	open my $fh, '<:raw', $png or die;
	read $fh, my $magic, 8;
	is($magic, "\x89PNG\r\n\x1a\n", "chart for experiment $id is a PNG");
	like($report, qr/\Q(experiment$id.png)\E/, "chart $id embedded in the report");
}
for my $id (grep { !$r{$_} } 1 .. 6)
{
	like($report, qr/## Experiment $id: not available\n\n\S/, "experiment $id says why it is not available");
}
like($report, qr/article_seconds/, 'article figures printed beside ours');
like($report, qr/ratio: ours [\d.]+x, article [\d.]+x/, 'ratios printed');

# Experiment 1: durable commits flush once each, delayed ones far fewer.
my ($durable1, $delayed1) = @{ $r{1}{rows} };
cmp_ok($durable1->{flushes}, '>=', $durable1->{transactions}, 'exp 1: durable flushes >= transactions');
cmp_ok($delayed1->{flushes}, '<', $durable1->{transactions} / 4, 'exp 1: delayed flushes far fewer');
is(join(',', map { $_->{database_mode} } @{ $r{1}{rows} }), 'allowed,allowed',
	'exp 1: the policy is ALLOWED, set per database');

# Experiment 5: with the buffer, durable commits avoid their WAL fsync.
my %e5 = map { ($_->{variant} => $_) } @{ $r{5}{rows} };
my $e5n = $e5{'durable, WAL fsync'}{transactions};
cmp_ok($e5{'durable, WAL fsync'}{flushes}, '>=', $e5n, 'exp 5: durable without the buffer flushes per commit');
cmp_ok($e5{'durable, WAL buffer on /dev/shm'}{flushes}, '<', $e5n / 4, 'exp 5: with the buffer, far fewer WAL fsyncs');
cmp_ok($e5{'durable, WAL buffer on /dev/shm'}{fsyncs_avoided}, '>=', $e5n, 'exp 5: one avoided fsync per commit');
like($report, qr/a real power cut needs a real persistent-memory \(DAX\) device/, 'exp 5 says /dev/shm is DRAM');
like($report, qr/goal at least 0.8x.*goal at least 5x/, 'exp 5 prints both ratios beside their goals');

# Experiment 2.
my %e2 = map { ("$_->{table}/$_->{durability}/$_->{transactions}" => $_) } @{ $r{2}{rows} };
my $n = $e2{'permanent/durable/1'}{rows};
cmp_ok($e2{"permanent/durable/$n"}{flushes}, '>=', $n, 'exp 2: durable per-row flushes >= transactions');
cmp_ok($e2{"permanent/delayed/$n"}{flushes}, '<', $n / 4, 'exp 2: delayed per-row flushes far fewer');
cmp_ok($e2{"temporary/durable/$n"}{flushes}, '<', $n / 4, 'exp 2: temporary table commits do not flush per row');
cmp_ok($e2{'permanent/durable/1'}{flushes}, '<=', 5, 'exp 2: one big transaction, a handful of flushes');
# Like for like with the article: WAL writes beside fsyncs, log records per
# transaction, the durability set per database.
cmp_ok($e2{"permanent/durable/$n"}{wal_writes}, '>=', $n, 'exp 2: durable per-row, a WAL write per commit');
cmp_ok($e2{"permanent/delayed/$n"}{wal_writes}, '>=', $e2{"permanent/delayed/$n"}{flushes},
	'exp 2: delayed, WAL writes at least the fsyncs');
cmp_ok($e2{"permanent/durable/$n"}{wal_records_per_row}, '>=', 2, 'exp 2: at least an insert and a commit record per transaction');
cmp_ok($e2{"permanent/durable/$n"}{wal_records_per_row}, '<', 3, 'exp 2: no begin record (fewer than the article\'s 3)');
is(join(',', map { $e2{"permanent/$_/$n"}{database_mode} } qw(durable delayed)), 'disabled,forced',
	'exp 2: durability set per database (ALTER DATABASE)');

# Experiment 3: one flush per CACHE values for cached_nextval, none for temp.
my %e3 = map { ("$_->{durability}/$_->{sequence}/$_->{cache}/$_->{function}" => $_) } @{ $r{3}{rows} };
for my $mode ('durable', 'delayed')
{
	my $c1 = $e3{"$mode/permanent/1/cached_nextval"};
	cmp_ok($c1->{flushes}, '>=', $c1->{values}, "exp 3 $mode: CACHE 1 flushes once per value");
	my $c50 = $e3{"$mode/permanent/50/cached_nextval"};
	cmp_ok($c50->{flushes}, '>=', $c50->{values} / 50, "exp 3 $mode: CACHE 50 at least values/50 flushes");
	cmp_ok($c50->{flushes}, '<=', $c50->{values} / 50 + 3, "exp 3 $mode: CACHE 50 at most values/50 + 3");
	cmp_ok($e3{"$mode/temporary/1/cached_nextval"}{flushes}, '<=', 2, "exp 3 $mode: temporary sequence does not flush");
	cmp_ok($e3{"$mode/unlogged/1/cached_nextval"}{flushes}, '<=', 2, "exp 3 $mode: unlogged sequence does not flush");
	cmp_ok($e3{"$mode/permanent/1/nextval"}{flushes}, '<=', 2, "exp 3 $mode: native nextval does not flush");
}

is(scalar(grep { $_->{article_flushes} ne '' } @{ $r{3}{rows} }), 12, "exp 3: the article's twelve cells beside ours");
like($report, qr/cached_nextval \/ nextval throughput, .+: [\d.]+x, 95% interval (n\/a \(too few pairs\)|[\d.]+-[\d.]+), \d+ interleaved pairs/,
	'exp 3: throughput ratios with their interval and pair count');

# The interval of paired.py: for 12 pairs the 3rd and 10th ratios (96.1%
# coverage, binomial), none below 6 pairs.
my ($interval) = `/usr/bin/python3 -c "import sys; sys.path.insert(0, '$work/pgbench'); import paired; print(paired.median_interval(list(range(12, 0, -1))), paired.median_interval([1, 2, 3, 4, 5]), round(paired.coverage(12), 4))"`;
is($interval, "(6.5, 3, 10) (3, None, None) 0.9614\n", 'median interval from order statistics');

# Experiment 4, both cases: the article's reading (one transaction per
# iteration) first, our many-small-commits case second, each with the three
# variants in order.
my @e4 = @{ $r{4}{rows} };
is(scalar(@e4), 6, 'exp 4: two cases of three variants');
is(join(',', map { $_->{database_mode} } @e4), 'disabled,allowed,forced,disabled,allowed,forced',
	"exp 4: the article's delayed run (ALLOWED, per-commit opt-in) first, FORCED second, in both cases");
like($e4[0]{case}, qr/article's reading/, "exp 4: the article's reading is the primary case");
# Many small commits: durable ones flush (group commit may share), delayed far fewer.
my ($durable4, $delayed4) = @e4[ 3, 4 ];
cmp_ok($durable4->{flushes}, '>', $delayed4->{flushes}, 'exp 4: durable run flushes more than the delayed one');
# Like for like with SQL Server's log flushes: WAL writes counted, at least
# one per durable commit's fsync.
cmp_ok($durable4->{wal_writes}, '>=', $durable4->{flushes}, 'exp 4: WAL writes counted, at least one per fsync');
# One transaction per iteration: a commit per iteration, each writing many rows.
cmp_ok($e4[0]{commits}, '<', $e4[3]{commits} / 2, "exp 4: the article's reading commits once per iteration");
cmp_ok($e4[0]{rows_per_commit}, '>', 1, "exp 4: the article's reading commits many rows at once");
# The article's Process Monitor view: durable commits write WAL about once
# each (group commit shares some), delayed ones far less often.
my $writes = $r{4}{second_case}{wal_writes};
ok($writes && $writes->{durable}, 'exp 4: WAL writes traced (strace)')
	or diag(join("\n", @{ $r{4}{notes} }));
cmp_ok($writes->{durable}{writes_per_commit}, '>', 2 * $writes->{$delayed4->{variant}}{writes_per_commit},
	'exp 4: durable commits write WAL far more often than delayed ones');
ok($r{4}{wal_writes} && $r{4}{wal_writes}{durable}, "exp 4: WAL writes traced in the article's reading too");
like($report, qr/### Wait events of the pgbench backends/, 'exp 4: wait events table');

# Experiment 6: same WAL volume, more segments with 1 MB segments.
my %e6 = map { ("$_->{step}/$_->{wal_segment_mb}" => $_) } @{ $r{6}{rows} };
for my $step ('insert', 'update', 'delete')
{
	my ($small, $big) = ($e6{"$step/1"}, $e6{"$step/64"});
	cmp_ok(abs($small->{wal_mb} - $big->{wal_mb}), '<=', 0.2 * $big->{wal_mb} + 0.5,
		"exp 6 $step: same WAL volume with both segment sizes");
	cmp_ok($small->{segments_filled}, '>', $big->{segments_filled}, "exp 6 $step: more segments when they are small");
	ok(($small->{segments_created} // '') ne '' && ($small->{segments_recycled} // '') ne '',
		"exp 6 $step: segments created and recycled counted");
}

# Experiment 8: power cuts of the delayed loop. The simulation traced WAL
# writes and syncs and zeroed what was not synced; a cut keeps at most one
# commit more than was acknowledged (the kill can fall between a commit's
# flush and its NOTICE); with max_loss_bytes = 64kB it loses at most the
# budget, plus the last commit's records and the one 8 KB page a cut may
# zero beyond what was really lost.
my @e8 = @{ $r{8}{rows} // [] };
ok(scalar(@e8) >= 2, 'exp 8: cuts with and without the budget')
	or diag($report =~ /(## Experiment 8: not available\n\n.*)/ ? $1 : 'no rows');
for my $cut (@e8)
{
	cmp_ok($cut->{traced_writes}, '>', 0, "exp 8 $cut->{variant}: WAL writes traced");
	cmp_ok($cut->{traced_syncs}, '>', 0, "exp 8 $cut->{variant}: WAL syncs traced");
	cmp_ok($cut->{survived}, '<=', $cut->{acknowledged} + 1, "exp 8 $cut->{variant}: survived <= acknowledged + 1");
	like($cut->{lost_wal_kb}, qr/^[\d.]+$/, "exp 8 $cut->{variant}: lost WAL measured");
	next unless $cut->{variant} =~ /max_loss_bytes = 64kB/;
	cmp_ok($cut->{survived}, '>', 0, "exp 8: with the budget, commits flushed before the cut survived");
	cmp_ok($cut->{lost_wal_kb}, '<=', 80, "exp 8: with max_loss_bytes = 64kB at most 64 kB (+ a page) of WAL lost ($cut->{lost_wal_kb})");
}

done_testing();
