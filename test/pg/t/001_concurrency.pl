# 001_concurrency.pl — many sessions generating at once.
#
# Sixteen sessions start their requests together (released by an advisory
# lock); each answer must equal the same request run alone, and the engine
# must have batched them (gemma_stats.max_batch_size > 1).  Then pgbench
# drives the functions from 16 clients, and the pool must end empty.  First,
# the server log's line for the ready model gives its memory budget.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin";
use G4Test;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = G4Test::new_node('concurrency');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gemma4');
is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)'), 't', 'the model is ready');

# The log says where the device memory went, in gemma_stats' figures.
{
	my ($backend, $kv_dtype, $weights, $kv, $ws) = split /\|/,
	  $node->safe_psql('postgres',
		'SELECT backend, kv_cache_dtype, weight_bytes, kv_bytes, workspace_bytes FROM gemma_stats');
	my $mib = sub { sprintf('%.1f', $_[0] / 1048576.0) };
	like(
		slurp_file($node->logfile),
		qr/gemma4 model ready: .*\n.*DETAIL:\s+\Q$backend\E backend on [^\n]+: weights \Q@{[$mib->($weights)]}\E MiB, KV pool \Q@{[$mib->($kv)]}\E MiB \(\Q$kv_dtype\E, \d+ sequences of the whole window\), workspace \Q@{[$mib->($ws)]}\E MiB\./,
		'the log gives the memory budget gemma_stats reports');
}

my $n = 16;

# The requests: plain generations, streams and chats with different prompts.
my @sql;
for my $i (0 .. $n - 1)
{
	my $prompt = "Tell me about item number $i";
	my $expr;
	if ($i % 4 == 1)
	{
		$expr = "(SELECT string_agg(p, '') FROM gemma_generate_stream('$prompt', max_tokens => 64) p)";
	}
	elsif ($i % 4 == 2)
	{
		$expr = "gemma_chat(jsonb_build_array(jsonb_build_object('role', 'user', 'content', '$prompt')), '{\"max_tokens\": 64}')->>'content'";
	}
	elsif ($i % 4 == 3)
	{
		$expr = "gemma_complete('$prompt', max_tokens => 64)";
	}
	else
	{
		$expr = "gemma_generate('$prompt', max_tokens => 64)";
	}
	push @sql, "SELECT md5($expr) || ' ' || length($expr)";
}

# Each request alone.
my @alone = map { $node->safe_psql('postgres', $_) } @sql;
my %distinct = map { $_ => 1 } @alone;
cmp_ok(scalar(keys %distinct), '>', 1, 'the requests give different answers');

my $before = $node->safe_psql('postgres', 'SELECT max_batch_size FROM gemma_stats');
is($before, '1', 'requests run alone are not batched');

# All at once: every session waits on an advisory lock held here, then the
# lock is released and the sixteen requests reach the engine together.
my $gate = $node->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(4242)');
my @runs;
for my $i (0 .. $n - 1)
{
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'psql', '-XAtq', '-d', $node->connstr('postgres'),
			'-c', 'SELECT pg_advisory_lock_shared(4242)',
			'-c', $sql[$i]
		],
		'>', \$out, '2>', \$err);
	push @runs, [ $h, \$out, \$err ];
}
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = $n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"),
	'all sessions wait at the gate');
$gate->query_safe('SELECT pg_advisory_unlock(4242)');

my $same = 0;
for my $i (0 .. $n - 1)
{
	my ($h, $out, $err) = @{ $runs[$i] };
	$h->finish;
	my @lines = split /\n/, $$out;
	my $got = $lines[-1] // '';
	if ($got eq $alone[$i] && $$err eq '')
	{
		$same++;
	}
	else
	{
		diag("session $i: alone '$alone[$i]', together '$got', stderr '$$err'");
	}
}
is($same, $n, "all $n concurrent answers equal the answers run alone");
$gate->quit;

my $batch = $node->safe_psql('postgres', 'SELECT max_batch_size FROM gemma_stats');
cmp_ok($batch, '>', 1, "the engine batched concurrent requests (largest batch $batch)");
my $mean = $node->safe_psql('postgres',
	"SELECT mean_batch_size > 1 FROM gemma_stats");
is($mean, 't', 'the mean batch is larger than one');

# pgbench: 16 clients, a mix of the functions, no errors.
$node->pgbench(
	'--no-vacuum --client=16 --jobs=4 --transactions=3',
	0,
	[qr{processed: 48/48}],
	[qr{^$}],
	'pgbench with 16 clients',
	{
		'001_generate' => q{
\set n random(1, 1000)
SELECT gemma_generate('Question ' || :n, max_tokens => 16);
SELECT gemma_chat(jsonb_build_array(jsonb_build_object('role', 'user', 'content', 'Hi ' || :n)), '{"max_tokens": 8}');
SELECT count(*) FROM (SELECT gemma_generate_stream('Stream ' || :n, max_tokens => 8)) s;
SELECT gemma_tokenize('Question ' || :n);
}
	});

ok(G4Test::wait_idle($node), 'no request left and the KV pool is empty');
is($node->safe_psql('postgres', 'SELECT errors FROM gemma_stats'), '0', 'no request failed');

$node->stop;
done_testing();
