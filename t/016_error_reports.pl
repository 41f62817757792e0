# Errors keep every field when the library is preloaded. The same statements
# run on a node without the library and on one with it preloaded, in each
# delayed_durability.mode; psql's complete verbose error report (message,
# SQLSTATE, DETAIL, HINT, LINE/caret, QUERY, CONTEXT, SCHEMA/TABLE/COLUMN/
# DATATYPE/CONSTRAINT NAME, LOCATION) must be byte for byte the same.
# Both nodes run the same server binary, so even the LOCATION lines match.
# Then: a server started with RUST_BACKTRACE=1 prints no Rust backtrace in an
# ordinary user error of the extension.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The two nodes differ only in shared_preload_libraries (and, on the
# preloaded one, the mode set with ALTER SYSTEM).
my $common_conf = q{
autovacuum = off
max_prepared_transactions = 2
};

sub new_node
{
	my ($name, $conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf', $common_conf . $conf);
	# Run clean whatever the caller's environment: a backtrace-enabled Rust
	# runtime is the subject of the last part of this test, not of this one.
	delete local $ENV{RUST_BACKTRACE};
	delete local $ENV{RUST_LIB_BACKTRACE};
	$node->start;
	return $node;
}

my $plain = new_node('plain', '');
my $pre = new_node('preloaded', "shared_preload_libraries = 'delayed_durability'\n");
is($plain->safe_psql('postgres', 'SHOW shared_preload_libraries'), '',
	'reference node runs without the library');
is($pre->safe_psql('postgres', 'SHOW shared_preload_libraries'), 'delayed_durability',
	'other node has the library preloaded');

# Identical objects on both nodes, in a database recreated for every round so
# that each round starts from the same state.
my $setup = q{
CREATE EXTENSION delayed_durability;
CREATE TABLE pk (a int PRIMARY KEY);
INSERT INTO pk VALUES (1);
CREATE VIEW pk_view AS SELECT * FROM pk;
CREATE PROCEDURE p() LANGUAGE plpgsql AS $$ BEGIN INSERT INTO pk VALUES (1); END $$;
-- Triggers whose function fails: once in plain SQL, once in a utility
-- statement it runs itself.
CREATE TABLE trg_t (a int);
CREATE FUNCTION trg_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO pk VALUES (NEW.a); RETURN NEW; END $$;
CREATE TRIGGER trg BEFORE INSERT ON trg_t FOR EACH ROW EXECUTE FUNCTION trg_fn();
CREATE TABLE trg_ddl (a int);
CREATE FUNCTION trg_ddl_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN EXECUTE 'ALTER TABLE pk ADD CONSTRAINT c3 CHECK (a < 0)'; RETURN NEW; END $$;
CREATE TRIGGER trg AFTER INSERT ON trg_ddl FOR EACH ROW EXECUTE FUNCTION trg_ddl_fn();
-- Deferred constraints.
CREATE TABLE def_u (a int UNIQUE DEFERRABLE INITIALLY DEFERRED);
CREATE TABLE def_parent (id int PRIMARY KEY);
CREATE TABLE def_child (pid int REFERENCES def_parent DEFERRABLE INITIALLY DEFERRED);
CREATE PROCEDURE p_commit() LANGUAGE plpgsql AS $$
BEGIN INSERT INTO def_u VALUES (4), (4); COMMIT; END $$;
-- Duplicates for unique index builds, NULLs for SET NOT NULL.
CREATE TABLE dup (a int);
INSERT INTO dup VALUES (1), (1);
CREATE TABLE nn (a int);
INSERT INTO nn VALUES (NULL);
-- Runs a statement and shows, from SQL, the fields of the error it raised.
CREATE FUNCTION diag(stmt text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE st text; m text; d text; h text; c text; col text; dt text; t text; s text; ctx text;
BEGIN
  EXECUTE stmt;
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, m = MESSAGE_TEXT,
    d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT, c = CONSTRAINT_NAME,
    col = COLUMN_NAME, dt = PG_DATATYPE_NAME, t = TABLE_NAME, s = SCHEMA_NAME,
    ctx = PG_EXCEPTION_CONTEXT;
  RAISE NOTICE E'caught from %\nsqlstate=%\nmessage=%\ndetail=%\nhint=%\nconstraint=%\ncolumn=%\ndatatype=%\ntable=%\nschema=%\ncontext=%',
    stmt, st, m, d, h, c, col, dt, t, s, ctx;
END $$;
};

sub fresh_db
{
	my ($node) = @_;
	# Only if a PREPARE TRANSACTION case unexpectedly succeeded: it would
	# block DROP DATABASE.
	# (Asked of postgres first: a psql to a database not created yet exits
	# before its input is written, and the broken pipe kills the test.)
	$node->safe_psql('errs', "ROLLBACK PREPARED 'dd016'")
	  if $node->safe_psql('postgres', "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'dd016'") ne '0';
	$node->safe_psql('postgres', 'DROP DATABASE IF EXISTS errs');
	$node->safe_psql('postgres', 'CREATE DATABASE errs');
	$node->safe_psql('errs', $setup);
}

# [name, psql script, regex the reference report must match (so that a case
# cannot pass by failing the same trivial way on both nodes)]
my @cases = (
	[ 'CREATE TABLE with aggregate in DEFAULT',
		'CREATE TABLE e1 (a int DEFAULT (avg(1)));',
		qr/ERROR:  42803: .*\nLINE 1: .*\n *\^\nLOCATION:  / ],
	[ 'COPY FROM STDIN, invalid row',
		"COPY pk FROM STDIN;\nx\n\\.\n",
		qr/ERROR:  22P02: .*\nCONTEXT:  COPY pk, line 1, column a: "x"/ ],
	[ 'COPY FROM STDIN, duplicate key',
		"COPY pk FROM STDIN;\n1\n\\.\n",
		qr/ERROR:  23505: .*\nDETAIL:  .*\nCONTEXT:  COPY pk, line 1\nSCHEMA NAME:  public\nTABLE NAME:  pk\nCONSTRAINT NAME:  pk_pkey\n/ ],
	[ 'DO block dividing by zero',
		'DO $$ BEGIN PERFORM 1/0; END $$;',
		qr/ERROR:  22012: .*\nCONTEXT:  SQL statement "SELECT 1\/0"\nPL\/pgSQL function inline_code_block line 1 at PERFORM/ ],
	[ 'CALL of a procedure violating a primary key',
		'CALL p();',
		qr/CONTEXT:  SQL statement "INSERT INTO pk VALUES \(1\)"\nPL\/pgSQL function p\(\) line 1 at SQL statement\nSCHEMA NAME:  public\nTABLE NAME:  pk\nCONSTRAINT NAME:  pk_pkey\n/ ],
	[ 'ALTER TABLE ADD CHECK violated by a row',
		'ALTER TABLE pk ADD CONSTRAINT c2 CHECK (a < 0);',
		qr/ERROR:  23514: .*\nSCHEMA NAME:  public\nTABLE NAME:  pk\nCONSTRAINT NAME:  c2\n/ ],
	[ 'ALTER TABLE SET NOT NULL with a NULL (column name)',
		'ALTER TABLE nn ALTER COLUMN a SET NOT NULL;',
		qr/ERROR:  23502: .*\nSCHEMA NAME:  public\nTABLE NAME:  nn\nCOLUMN NAME:  a\n/ ],
	[ 'DROP TABLE with dependents (DETAIL and HINT)',
		'DROP TABLE pk;',
		qr/ERROR:  2BP01: .*\nDETAIL:  .*\nHINT:  / ],
	[ 'INSERT firing a trigger whose function fails',
		'INSERT INTO trg_t VALUES (1);',
		qr/CONTEXT:  SQL statement "INSERT INTO pk VALUES \(NEW.a\)"\nPL\/pgSQL function trg_fn\(\) line 2 at SQL statement\nSCHEMA NAME:  public\nTABLE NAME:  pk\nCONSTRAINT NAME:  pk_pkey\n/ ],
	[ 'COPY firing a trigger whose function fails',
		"COPY trg_t FROM STDIN;\n1\n\\.\n",
		qr/CONTEXT:  .*\nPL\/pgSQL function trg_fn\(\) line 2 at SQL statement\nCOPY trg_t, line 1: "1"\nSCHEMA NAME:  public\nTABLE NAME:  pk\nCONSTRAINT NAME:  pk_pkey\n/ ],
	[ 'trigger function running a failing utility statement',
		'INSERT INTO trg_ddl VALUES (1);',
		qr/CONTEXT:  SQL statement "ALTER TABLE pk ADD CONSTRAINT c3 CHECK \(a < 0\)"\nPL\/pgSQL function trg_ddl_fn\(\) line 2 at EXECUTE\nSCHEMA NAME:  public\nTABLE NAME:  pk\nCONSTRAINT NAME:  c3\n/ ],
	[ 'deferred unique constraint failing at COMMIT',
		"BEGIN;\nINSERT INTO def_u VALUES (1), (1);\nCOMMIT;",
		qr/ERROR:  23505: .*\nDETAIL:  .*\nSCHEMA NAME:  public\nTABLE NAME:  def_u\nCONSTRAINT NAME:  def_u_a_key\n/ ],
	[ 'deferred foreign key failing at COMMIT',
		"BEGIN;\nINSERT INTO def_child VALUES (99);\nCOMMIT;",
		qr/ERROR:  23503: .*\nDETAIL:  .*\nSCHEMA NAME:  public\nTABLE NAME:  def_child\nCONSTRAINT NAME:  def_child_pid_fkey\n/ ],
	[ 'deferred foreign key failing at SET CONSTRAINTS ALL IMMEDIATE',
		"BEGIN;\nINSERT INTO def_child VALUES (98);\nSET CONSTRAINTS ALL IMMEDIATE;\nROLLBACK;",
		qr/CONSTRAINT NAME:  def_child_pid_fkey\n/ ],
	[ 'deferred unique failing at COMMIT with synchronous_commit off',
		"BEGIN;\nSET LOCAL synchronous_commit = off;\nINSERT INTO def_u VALUES (3), (3);\nCOMMIT;",
		qr/CONSTRAINT NAME:  def_u_a_key\n/ ],
	[ 'deferred unique failing at COMMIT inside a procedure',
		'CALL p_commit();',
		qr/CONTEXT:  PL\/pgSQL function p_commit\(\) line 2 at COMMIT\nSCHEMA NAME:  public\nTABLE NAME:  def_u\nCONSTRAINT NAME:  def_u_a_key\n/ ],
	[ 'deferred unique failing at PREPARE TRANSACTION',
		"BEGIN;\nINSERT INTO def_u VALUES (5), (5);\nPREPARE TRANSACTION 'dd016';\nSELECT count(*) FROM pg_prepared_xacts;",
		qr/CONSTRAINT NAME:  def_u_a_key\n/ ],
	# CIC leaves an INVALID index behind: drop it, and show none is left.
	[ 'CREATE UNIQUE INDEX CONCURRENTLY on duplicates',
		"CREATE UNIQUE INDEX CONCURRENTLY dup_a ON dup (a);\nDROP INDEX dup_a;\n"
		  . "SELECT count(*) FROM pg_index WHERE indrelid = 'dup'::regclass;",
		qr/ERROR:  23505: could not create unique index "dup_a"\nDETAIL:  .*\nSCHEMA NAME:  public\nTABLE NAME:  dup\nCONSTRAINT NAME:  dup_a\n/ ],
	[ 'GET STACKED DIAGNOSTICS after CALL',
		"SELECT diag('CALL p()');",
		qr/NOTICE:  00000: caught from CALL p\(\)\nsqlstate=23505\n.*\nconstraint=pk_pkey\ncolumn=\ndatatype=\ntable=pk\nschema=public\ncontext=SQL statement "INSERT INTO pk VALUES \(1\)"\nPL\/pgSQL function p\(\) line 1 at SQL statement\n/s ],
	[ 'GET STACKED DIAGNOSTICS after ALTER TABLE ADD CHECK',
		"SELECT diag('ALTER TABLE pk ADD CONSTRAINT c2 CHECK (a < 0)');",
		qr/constraint=c2\ncolumn=\ndatatype=\ntable=pk\nschema=public\ncontext=SQL statement "ALTER TABLE pk ADD CONSTRAINT c2 CHECK \(a < 0\)"\n/ ],
	[ 'GET STACKED DIAGNOSTICS after SET NOT NULL',
		"SELECT diag('ALTER TABLE nn ALTER COLUMN a SET NOT NULL');",
		qr/sqlstate=23502\n.*\ncolumn=a\ndatatype=\ntable=nn\nschema=public\n/s ],
	[ 'GET STACKED DIAGNOSTICS in a DO block after CREATE UNIQUE INDEX',
		"DO \$\$ BEGIN PERFORM diag('CREATE UNIQUE INDEX dup_u ON dup (a)'); END \$\$;",
		qr/constraint=dup_u\ncolumn=\ndatatype=\ntable=dup\nschema=public\ncontext=SQL statement "CREATE UNIQUE INDEX dup_u ON dup \(a\)"\n/ ],
	[ 'RAISE with every optional field',
		"DO \$\$ BEGIN RAISE EXCEPTION USING MESSAGE = 'custom', DETAIL = 'd', HINT = 'h', "
		  . "ERRCODE = 'P0099', COLUMN = 'col', CONSTRAINT = 'con', DATATYPE = 'dt', "
		  . "TABLE = 'tab', SCHEMA = 'sch'; END \$\$;",
		qr/ERROR:  P0099: custom\nDETAIL:  d\nHINT:  h\nCONTEXT:  .*\nSCHEMA NAME:  sch\nTABLE NAME:  tab\nCOLUMN NAME:  col\nDATATYPE NAME:  dt\nCONSTRAINT NAME:  con\n/ ],
	[ 'DO block EXECUTE of a query on a missing table (QUERY and position)',
		"DO \$\$ BEGIN EXECUTE 'SELECT * FROM no_such_tab'; END \$\$;",
		qr/ERROR:  42P01: .*\nLINE 1: SELECT \* FROM no_such_tab\n *\^\nQUERY:  SELECT \* FROM no_such_tab\nCONTEXT:  PL\/pgSQL function inline_code_block line 1 at EXECUTE\n/ ],
	[ 'VACUUM of a missing table',
		'VACUUM no_such_table;',
		qr/ERROR:  42P01: relation "no_such_table" does not exist\nLOCATION:  / ],
	[ 'failing DDL in an explicit transaction block',
		"BEGIN;\nCREATE TABLE tx1 (a int);\nALTER TABLE tx1 ADD COLUMN a int;\nSELECT 1;\nCOMMIT;\n"
		  . "SELECT to_regclass('tx1') IS NULL;",
		qr/ERROR:  42701: .*\nLOCATION:  .*\n.*ERROR:  25P02: current transaction is aborted/ ],
	[ 'DDL error with a position in an explicit transaction block',
		"BEGIN;\nCREATE TABLE tx2 (a int);\nCREATE TABLE tx3 (b int DEFAULT (avg(1)));\nCOMMIT;\n"
		  . "SELECT to_regclass('tx2') IS NULL;",
		qr/ERROR:  42803: .*\nLINE 1: .*\n *\^\n/ ],
	[ 'DDL error with a position in a multi-statement query string',
		'SELECT 1 \; CREATE TABLE e2 (a int DEFAULT (avg(1)));',
		qr/ERROR:  42803: .*\nLINE 1: .*\n *\^\n/ ],
	[ 'EXECUTE of a prepared INSERT violating a primary key',
		"PREPARE q(int) AS INSERT INTO pk VALUES (\$1);\nEXECUTE q(1);",
		qr/CONSTRAINT NAME:  pk_pkey\n/ ],
	[ 'FETCH from a cursor whose query fails',
		"BEGIN;\nDECLARE c CURSOR FOR SELECT 1/(a - 1) FROM pk;\nFETCH c;\nROLLBACK;",
		qr/ERROR:  22012: / ],
	[ 'CREATE TABLE AS of a failing query',
		'CREATE TABLE ctas AS SELECT 1/0;',
		qr/ERROR:  22012: / ],
	[ 'EXPLAIN ANALYZE of a failing query',
		'EXPLAIN (ANALYZE, COSTS OFF) SELECT 1/0;',
		qr/ERROR:  22012: / ],
	# Not an error: a notice raised during a utility statement.
	[ 'notice of CREATE TABLE IF NOT EXISTS',
		'CREATE TABLE IF NOT EXISTS pk (a int);',
		qr/NOTICE:  42P07: relation "pk" already exists, skipping/ ],
);

my $header = "\\set VERBOSITY verbose\n\\set SHOW_CONTEXT always\n";

# Runs every case, each in its own psql, on a fresh database. Each report is
# psql's whole stderr, compared as is: it contains no data directory path and
# no port, so nothing is normalised. stdout and the exit status are compared
# too (e.g. that the failed transaction left nothing behind).
sub run_cases
{
	my ($node) = @_;
	fresh_db($node);
	my @results;
	for my $case (@cases)
	{
		my ($ret, $out, $err) = $node->psql('errs', $header . $case->[1], on_error_stop => 0);
		push @results, { err => $err, out => "exit status $ret\n$out" };
	}
	return @results;
}

my @expected = run_cases($plain);
for my $i (0 .. $#cases)
{
	my ($name, undef, $shape) = @{ $cases[$i] };
	like($expected[$i]{err}, $shape, "$name: reference report (without library) has the expected fields");
}

for my $mode (qw(disabled allowed forced))
{
	$pre->safe_psql('postgres', "ALTER SYSTEM SET delayed_durability.mode = '$mode'");
	$pre->reload;
	# Once a new session sees the value, the postmaster has reloaded, and
	# every later session (each case's psql) starts with it.
	$pre->poll_query_until('postgres', "SELECT current_setting('delayed_durability.mode') = '$mode'")
	  or die "mode $mode not in effect";
	is($pre->safe_psql('postgres', 'SHOW delayed_durability.mode'), $mode, "round $mode: SHOW delayed_durability.mode");
	my @got = run_cases($pre);
	is($pre->safe_psql('errs', 'SHOW delayed_durability.mode'), $mode, "round $mode: mode still in effect after the round");
	for my $i (0 .. $#cases)
	{
		my $name = $cases[$i][0];
		is($got[$i]{err}, $expected[$i]{err}, "$name: report identical without/with library ($mode)");
		is($got[$i]{out}, $expected[$i]{out}, "$name: output and exit status identical without/with library ($mode)");
	}
}
$plain->stop;

# A server whose environment has RUST_BACKTRACE=1 (set by many developers'
# shells and service managers) still reports ordinary user errors without a
# Rust backtrace, with their SQLSTATE and message: the reports are the same as
# from the same server started without it.
$pre->safe_psql('postgres', q{
ALTER SYSTEM RESET delayed_durability.mode;
CREATE EXTENSION delayed_durability;
CREATE TABLE not_a_sequence_table (a int);
CREATE SEQUENCE rb_seq;
});
my @user_errors = (
	# A PostgreSQL error raised inside the extension's Rust code (the kind
	# pgrx turns into a Rust panic and back): PreventCommandIfReadOnly.
	[ "BEGIN READ ONLY; SELECT cached_nextval('rb_seq')",
		qr/^psql:<stdin>:3: ERROR:  25006: cannot execute cached_nextval\(\) in a read-only transaction\n/ ],
	[ 'SELECT cached_nextval(0)', qr/^psql:<stdin>:3: ERROR:  [0-9A-Z]{5}: .*\bOID 0\b/ ],
	[ "SELECT cached_nextval('not_a_sequence_table')",
		qr/^psql:<stdin>:3: ERROR:  42809: "not_a_sequence_table" is not a sequence\n/ ],
	[ 'VACUUM no_such_table', qr/^psql:<stdin>:3: ERROR:  42P01: relation "no_such_table" does not exist\n/ ]);
# The node was started with RUST_BACKTRACE and RUST_LIB_BACKTRACE unset.
my %clean;
for my $case (@user_errors)
{
	my ($sql, $report) = @$case;
	(undef, undef, $clean{$sql}) = $pre->psql('postgres', "$header$sql;");
	like($clean{$sql}, $report, "without RUST_BACKTRACE: $sql reports SQLSTATE and message");
}
$pre->stop;
{
	local $ENV{RUST_BACKTRACE} = '1';
	# RUST_LIB_BACKTRACE=0 would override it for std::backtrace.
	delete local $ENV{RUST_LIB_BACKTRACE};
	$pre->start;
}
my $pm_pid = (split /\n/, slurp_file($pre->data_dir . '/postmaster.pid'))[0];
like(slurp_file("/proc/$pm_pid/environ"), qr/(?:^|\0)RUST_BACKTRACE=1\0/,
	'the restarted server runs with RUST_BACKTRACE=1');
my $log_offset = -s $pre->logfile;
my $backtrace = qr/backtrace|rust_begin_unwind|\bat \S+\.rs:\d+/i;
for my $case (@user_errors)
{
	my ($sql, $report) = @$case;
	my ($ret, $out, $err) = $pre->psql('postgres', "$header$sql;");
	isnt($ret, 0, "RUST_BACKTRACE=1: $sql fails");
	unlike($err, $backtrace, "RUST_BACKTRACE=1: $sql reports no Rust backtrace");
	like($err, $report, "RUST_BACKTRACE=1: $sql keeps SQLSTATE and message");
	is($err, $clean{$sql}, "RUST_BACKTRACE=1: $sql report identical to the one without it");
}
unlike(slurp_file($pre->logfile, $log_offset), $backtrace,
	'RUST_BACKTRACE=1: no Rust backtrace in the server log either');

$pre->stop;
done_testing();
