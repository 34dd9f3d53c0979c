# 007_long_step.pl — a long step is no stall.
#
# On the deep fixture (32 layers), the prefill of a prompt of some 650
# tokens is one step of a few seconds on two cores, longer than
# gemma4.engine_stall_timeout at its minimum (1 s), each layer a small part
# of it.  The engine process reports from inside the step, so the watchdog
# leaves it alone: the request succeeds and the engine is not restarted.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin";
use G4Test;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $deep = $ENV{G4_DEEP_MODEL_DIR};
plan skip_all => 'no deep fixture model (G4_DEEP_MODEL_DIR; run-pg-tests.sh makes one)'
  unless $deep && -f "$deep/config.json";

my $stall_ms = 1000;
my $node = G4Test::new_node(
	'long_step', qq{
gemma4.model_dir = '$deep'
gemma4.engine_stall_timeout = '${stall_ms}ms'
gemma4.max_num_batched_tokens = 2048
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gemma4');
is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)'), 't', 'the deep model is ready');

my ($pid, $restarts) = split /\|/, $node->safe_psql('postgres', 'SELECT engine_pid, engine_restarts FROM gemma_stats');
my $prompt = "repeat('the quick brown fox jumps over the lazy dog ', 50)";
my $n_tokens = $node->safe_psql('postgres', "SELECT cardinality(gemma_tokenize($prompt))");
cmp_ok($n_tokens, '>=', 600, "the prompt takes $n_tokens tokens");

my $t0 = time;
my ($ret, $out, $err) =
  $node->psql('postgres', "SELECT length(gemma_complete($prompt, max_tokens => 4)) >= 0",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
my $elapsed = time - $t0;
is($out, 't', 'the request succeeds') or diag($err);
cmp_ok($elapsed * 1000, '>', $stall_ms,
	sprintf('the request outlasted gemma4.engine_stall_timeout (%.2f s)', $elapsed));
is( $node->safe_psql('postgres', 'SELECT max_batch_tokens >= ' . ($n_tokens - 1) . ' FROM gemma_stats'),
	't', 'the prompt was one step');
is($node->safe_psql('postgres', 'SELECT engine_pid, engine_restarts FROM gemma_stats'),
	"$pid|$restarts", 'the engine process was not restarted');
unlike(slurp_file($node->logfile), qr/is stalled/, 'the watchdog never fired');

$node->stop;
done_testing();
