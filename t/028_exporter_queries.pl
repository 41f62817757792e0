# The monitoring files of docs/ work against a real server: every query of
# docs/postgres_exporter.yml runs, as a pg_monitor role with the extension
# in a schema of its own on its search_path, and returns exactly the
# columns its metrics declare, numeric where they are counters or gauges;
# every metric an alert rule of docs/alerts.yml names is one the queries
# produce. A crash is made first, so that the crash report has a row.
use strict;
use warnings;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $work = $ENV{REPO_WORK} or plan skip_all => 'REPO_WORK not set (run through scripts/test.sh)';

# YAML read by PyYAML (python3-yaml), handed over as JSON.
sub read_yaml
{
	my ($path) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ '/usr/bin/python3', '-c', 'import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))', $path ],
		'>', \$out, '2>', \$err)
	  or die "$path: $err";
	return decode_json($out);
}
my $queries = read_yaml("$work/docs/postgres_exporter.yml");
my $alerts = read_yaml("$work/docs/alerts.yml");
cmp_ok(scalar keys %$queries, '>=', 4, 'the exporter file has its queries');

my $node = new_dd_node('exporter', conf => "restart_after_crash = on\n");
$node->safe_psql('postgres', q{
DROP EXTENSION delayed_durability;
CREATE SCHEMA delayed_durability;
CREATE EXTENSION delayed_durability SCHEMA delayed_durability;
CREATE ROLE exporter LOGIN IN ROLE pg_monitor;
ALTER ROLE exporter SET search_path = delayed_durability, public;
GRANT USAGE ON SCHEMA delayed_durability TO exporter;
CREATE TABLE t (i int);
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
});
# A crash with delayed commits, so the report has a row.
$node->safe_psql('postgres', 'INSERT INTO t VALUES (1)');
my $walwriter = $node->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
kill 'KILL', $walwriter;
$node->poll_query_until('postgres', 'SELECT count(*) > 0 FROM delayed_durability.delayed_durability_crashes') or die 'no crash row';

my %produced;
for my $name (sort keys %$queries)
{
	my $q = $queries->{$name};
	my @declared = map { my ($col) = keys %$_; [ $col, $_->{$col}{usage} ] } @{ $q->{metrics} };
	my ($ret, $out, $err) = $node->psql('postgres', "\\pset footer off\n\\pset tuples_only off\n$q->{query}",
		extra_params => [ '-U', 'exporter', '-A', '-F', "\t", '--no-psqlrc' ]);
	is($ret, 0, "$name: runs as a pg_monitor role") or do { diag($err); next };
	my ($header, @rows) = grep { length } split /\n/, $out;
	my @columns = split /\t/, $header // '';
	is(join(',', sort @columns), join(',', sort map { $_->[0] } @declared), "$name: returns exactly the declared columns");
	cmp_ok(scalar @rows, '>=', 1, "$name: returns rows");
	my %index = map { $columns[$_] => $_ } 0 .. $#columns;
	my @bad;
	for my $row (@rows)
	{
		my @v = split /\t/, $row, -1;
		for my $d (grep { $_->[1] ne 'LABEL' } @declared)
		{
			my $value = $v[ $index{ $d->[0] } // 0 ] // '';
			push @bad, "$d->[0]=$value" unless $value =~ /^-?\d+(\.\d+)?(e[-+]?\d+)?$/i;
		}
	}
	is(join(' ', @bad), '', "$name: every counter and gauge is a number");
	$produced{"${name}_$_->[0]"} = 1 for grep { $_->[1] ne 'LABEL' } @declared;
}
is($node->safe_psql('postgres', q{SET search_path = delayed_durability;
SELECT crashes >= 1 FROM (SELECT count(*) AS crashes FROM delayed_durability_crashes) c}), 't', 'the crash made a row');

# Each alert names only metrics the queries produce.
my @rules = map { @{ $_->{rules} } } @{ $alerts->{groups} };
cmp_ok(scalar @rules, '>=', 3, 'alert rules present');
for my $rule (@rules)
{
	my @metrics = $rule->{expr} =~ /\b(delayed_durability_\w+)/g;
	cmp_ok(scalar @metrics, '>=', 1, "$rule->{alert}: uses the extension's metrics");
	is(join(',', grep { !$produced{$_} } @metrics), '', "$rule->{alert}: every metric it names is produced");
}

$node->stop;
done_testing();
