# 004_roles.pl — one role cannot hurt another.
#
#   - the grant model: a role without gemma_user cannot call the functions;
#   - while one role floods the engine (batch calls wanting every slot) and
#     sends oversized inputs in a loop, another role's requests all succeed,
#     each within a bounded time, and the flooding role's requests wait for
#     a slot instead of failing;
#   - the watchdog: an engine process that stops (SIGSTOP) with work queued
#     is reported, killed and restarted; the request in flight fails with
#     58000.
#   - under a per-role limit below a batch's window (and a job worker's),
#     with no queue_timeout, the batch and the job complete; a request
#     refused by its role's limit says so.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin";
use G4Test;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = G4Test::new_node(
	'roles', q{
gemma4.max_requests = 8
gemma4.engine_stall_timeout = '3s'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gemma4');
is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)'), 't', 'the model is ready');
$node->safe_psql(
	'postgres', q{
CREATE ROLE abuser LOGIN;
CREATE ROLE victim LOGIN;
CREATE ROLE outsider LOGIN;
GRANT gemma_user TO abuser, victim;
ALTER ROLE abuser SET gemma4.max_prompt_bytes = '64MB';
});

sub as_role
{
	my ($role, $sql) = @_;
	return $node->psql('postgres', $sql, extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose' ]);
}

# ---- who may call what -------------------------------------------------------
{
	my ($ret, $out, $err) = as_role('outsider', "SELECT gemma_generate('Hello', max_tokens => 2)");
	like($err, qr/ERROR:  42501: permission denied for function gemma_generate/,
		'grants: a role without gemma_user cannot generate');
	($ret, $out, $err) = as_role('outsider', "SELECT gemma_tokenize('Hello')");
	like($err, qr/42501/, 'grants: nor tokenize');
	($ret, $out, $err) = as_role('victim', "SELECT gemma_generate('Hello', max_tokens => 2) IS NOT NULL");
	is($out, 't', 'grants: a member of gemma_user can');
}

# ---- one role floods the engine and sends oversized inputs ------------------
my $restarts = $node->safe_psql('postgres', 'SELECT engine_restarts FROM gemma_stats');
my @abuse;
for my $i (1 .. 4)
{
	# each batch keeps half of gemma4.max_requests in flight: four of them
	# would hold every slot twice over
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'psql', '-XAtq', '-U', 'abuser', '-d', $node->connstr('postgres'),
			'-c', "SELECT cardinality(gemma_complete_batch(array_fill('Tell me a story number $i'::text, ARRAY[12]), max_tokens => 300))"
		],
		'>', \$out, '2>', \$err);
	push @abuse, [ $h, \$out, \$err ];
}
my ($big_out, $big_err) = ('', '');
my $big = IPC::Run::start(
	[
		'psql', '-XAtq', '-U', 'abuser', '-d', $node->connstr('postgres'),
		'-c', q{DO $$ BEGIN FOR i IN 1..5 LOOP
			BEGIN PERFORM gemma_detokenize(array_fill(231582, ARRAY[27000000])); EXCEPTION WHEN program_limit_exceeded THEN NULL; END;
			BEGIN PERFORM gemma_complete('a', max_tokens => 1, stop => array_fill(repeat('z', 1000000), ARRAY[400]));
				EXCEPTION WHEN program_limit_exceeded THEN NULL; END;
			BEGIN PERFORM gemma_generate(repeat('<turn|>', 20000)); EXCEPTION WHEN program_limit_exceeded THEN NULL; END;
		END LOOP; END $$}
	],
	'>', \$big_out, '2>', \$big_err);

# a 36 MB text to tokenize: prepared off the engine's loop, it holds up nobody
my ($tok_out, $tok_err) = ('', '');
my $tok = IPC::Run::start(
	[
		'psql', '-XAtq', '-U', 'abuser', '-d', $node->connstr('postgres'),
		'-c', "SELECT cardinality(gemma_tokenize(repeat('hello world ', 3000000))) > 0"
	],
	'>', \$tok_out, '2>', \$tok_err);

ok( $node->poll_query_until(
		'postgres', q{SELECT count(*) >= 4 FROM gemma_requests r JOIN pg_stat_activity a USING (pid)
					  WHERE a.usename = 'abuser'}),
	'flood: the flooding role has requests in flight');

# the other role, meanwhile: every request answered, none waiting long
my ($ok, $slowest) = (0, 0);
for my $i (1 .. 6)
{
	my $t0 = time;
	my ($ret, $out, $err) = as_role('victim', "SELECT gemma_generate('Hello number $i', max_tokens => 8) IS NOT NULL");
	my $elapsed = time - $t0;
	$slowest = $elapsed if $elapsed > $slowest;
	$ok++ if $ret == 0 && $out eq 't';
	diag("victim request $i: $err") if $ret != 0;
}
is($ok, 6, 'flood: every request of the other role succeeded');
cmp_ok($slowest, '<', 20, sprintf('flood: the slowest took under 20 s (%.2f s)', $slowest));

for my $r (@abuse)
{
	$r->[0]->finish;
}
is(scalar(grep { ${ $_->[1] } =~ /^12\s*$/ } @abuse), 4, 'flood: the flooding role\'s batches all completed (they waited)');
is(join('', map { ${ $_->[2] } } @abuse), '', 'flood: none failed for want of a slot');
$big->finish;
$tok->finish;
like($tok_out, qr/^t/, 'a large text to tokenize was tokenized meanwhile');
is($big_err, '', 'oversized inputs: each failed alone, as expected');
is($node->safe_psql('postgres', 'SELECT engine_restarts FROM gemma_stats'),
	$restarts, 'the engine never restarted');
ok(G4Test::wait_idle($node), 'the KV pool is empty');

# ---- the watchdog -------------------------------------------------------------
{
	my $old = $node->safe_psql('postgres', 'SELECT engine_pid FROM gemma_stats');
	kill 'STOP', $old;
	my $t0 = time;
	my ($ret, $out, $err) = as_role('victim', "SELECT gemma_generate('Hello', max_tokens => 4)");
	my $elapsed = time - $t0;
	like($err, qr/ERROR:  58000: .*made no progress for 3000 ms/,
		'watchdog: the request on a stopped engine fails with 58000');
	cmp_ok($elapsed, '<', 15, sprintf('watchdog: within 15 s (%.2f s)', $elapsed));
	ok( $node->poll_query_until(
			'postgres',
			"SELECT worker_state = 'ready' AND engine_pid <> $old AND engine_restarts = $restarts + 1 FROM gemma_stats"),
		'watchdog: a new engine process is ready');
	ok(!kill(0, $old), 'watchdog: the stopped process is gone');
	like(slurp_file($node->logfile), qr/gemma4 engine process $old is stalled/, 'watchdog: the log says why');
	($ret, $out, $err) = as_role('victim', "SELECT gemma_generate('Hello', max_tokens => 4) IS NOT NULL");
	is($out, 't', 'watchdog: the new engine serves');
}

# ---- a role's own limit: batches and table jobs stay within it --------------
# A batch keeps up to half of gemma4.max_requests in flight, a job worker
# its share of them.  Under a lower per-role limit they collect their own
# requests before starting more, instead of waiting for a slot that only
# those requests could free (and, with no queue_timeout, failing at once).
{
	$node->safe_psql(
		'postgres', q{
CREATE ROLE capped LOGIN;
GRANT gemma_user TO capped;
ALTER ROLE capped SET gemma4.max_requests_per_role = 2;
ALTER ROLE capped SET gemma4.queue_timeout = 0;
CREATE TABLE capped_docs (id int PRIMARY KEY, body text NOT NULL, summary text);
INSERT INTO capped_docs SELECT i, 'Document number ' || i FROM generate_series(1, 12) i;
GRANT SELECT, UPDATE ON capped_docs TO capped;
});
	my ($ret, $out, $err) = as_role('capped',
		q{SELECT cardinality(a), count(x) FROM gemma_complete_batch(array_fill('Once upon a time'::text, ARRAY[5]),
			max_tokens => 40) a, unnest(a) x GROUP BY a});
	is($out, '5|5', 'role limit: a 5-prompt batch under a limit of 2 returns 5 answers');
	is($err, '', 'role limit: the batch waited for nothing');
	($ret, $out, $err) = as_role('capped',
		q{SELECT cardinality(a), count(x) FROM gemma_generate_batch(ARRAY['Hello', NULL, 'Hi there', 'Tell me more',
			'Why?', 'Good night'], max_tokens => 30) a, unnest(a) x GROUP BY a});
	is($out, '6|5', 'role limit: a chat batch with a NULL prompt returns its 5 answers and the NULL');
	is($err, '', 'role limit: the chat batch waited for nothing');

	# another session of the role holds both slots: the refusal names the
	# role's limit, not a lack of free slots
	my @holders;
	for my $i (1 .. 2)
	{
		my $h = $node->background_psql('postgres', extra_params => [ '-U', 'capped' ]);
		$h->query_safe('BEGIN');
		$h->query_safe("DECLARE c CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 3000)");
		$h->query_safe('FETCH 1 FROM c');
		push @holders, $h;
	}
	($ret, $out, $err) = as_role('capped', "SELECT gemma_complete_batch(ARRAY['a', 'b'], max_tokens => 4)");
	like($err,
		qr/ERROR:  53000: too many concurrent gemma4 requests: this role already holds its limit of 2 requests \(gemma4.max_requests_per_role\)\n.*DETAIL:  This role holds 2 of 8 request slots/,
		'role limit: a request refused by its role\'s limit says so');
	$_->query_safe('ROLLBACK') for @holders;
	$_->quit for @holders;
	ok(G4Test::wait_idle($node), 'role limit: the slots are free again');

	# a table job of the role: its worker keeps 4 requests in flight at most
	my $job = $node->safe_psql('postgres',
		q{SET ROLE capped; SELECT gemma_job_create('capped_docs', 'summary', 'body', options => '{"max_tokens": 30}')});
	ok( $node->poll_query_until(
			'postgres', "SELECT state = 'done' FROM gemma_jobs WHERE job = $job"),
		'role limit: the job of a role limited to 2 requests completes');
	is( $node->safe_psql(
			'postgres', "SELECT rows_done, rows_failed FROM gemma_jobs WHERE job = $job"),
		'12|0', 'role limit: every row of the job answered, none failed');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM capped_docs WHERE summary IS NULL'),
		'0', 'role limit: every row has its answer');
}

# ---- a database in another encoding -----------------------------------------
# Output is converted to the database encoding; a character it cannot hold
# fails the call with 22P05, naming both encodings, or becomes '?' where
# gemma4.untranslatable_characters is replace.
{
	my $ids = $node->safe_psql('postgres', "SELECT gemma_tokenize(chr(20013))");
	$node->safe_psql('postgres',
		"CREATE DATABASE latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
	$node->safe_psql('latin1', 'CREATE EXTENSION gemma4');
	is($node->safe_psql('latin1', "SELECT gemma_detokenize(gemma_tokenize(convert_from('\\x636166e9', 'LATIN1'))) = convert_from('\\x636166e9', 'LATIN1')"),
		't', 'LATIN1 database: text it can hold round-trips');
	my ($ret, $out, $err) = $node->psql('latin1', "SELECT gemma_detokenize('$ids')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  22P05: character with byte sequence 0xe4 0xb8 0xad in encoding "UTF8" has no equivalent in encoding "LATIN1"/,
		'LATIN1 database: a character it cannot hold is an error naming the encodings');

	# gemma4.untranslatable_characters = replace: '?' for each such
	# character, the rest kept ("café 中文 ok" -> "café ?? ok")
	my $mixed = $node->safe_psql('postgres',
		"SELECT gemma_tokenize('caf' || chr(233) || ' ' || chr(20013) || chr(25991) || ' ok')");
	is( $node->safe_psql(
			'latin1', "SET gemma4.untranslatable_characters = replace; "
			  . "SELECT encode(convert_to(gemma_detokenize('$mixed'), 'LATIN1'), 'hex')"),
		'636166e9203f3f206f6b',
		'LATIN1 database, replace: each character it cannot hold becomes ?, the rest is kept');
	is( $node->safe_psql(
			'latin1', "SET gemma4.untranslatable_characters = replace; SELECT gemma_detokenize('$ids')"),
		'?', 'LATIN1 database, replace: an answer of one such character');
	($ret, $out, $err) = $node->psql('latin1', "SELECT gemma_detokenize('$mixed')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  22P05/, 'LATIN1 database: error stays the default');
	($ret, $out, $err) = $node->psql('latin1', "SET gemma4.untranslatable_characters = ignore",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  22023: invalid value for parameter "gemma4.untranslatable_characters": "ignore"/,
		'untranslatable_characters: an unknown value is refused');
}

$node->stop;
done_testing();
