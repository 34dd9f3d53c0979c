# 002_faults.pl — faults and the worker's life cycle.
#
#   - kill -9 of the engine process mid-request and mid-stream: the session
#     gets an error within 5 s, unrelated sessions keep their backend and
#     their open transaction, the postmaster does not restart, the engine
#     comes back and serves the same answers, the KV pool ends empty;
#   - pg_cancel_backend mid-stream, statement_timeout, a closed cursor;
#   - 1,000 failing calls leave no KV blocks, slots or DSM mappings behind;
#   - the supervisor itself terminated: it restarts, nothing else does; a
#     finished stream still waiting for its reader ends with an error;
#   - a model that cannot be loaded, no model configured, the library not
#     preloaded, invalid settings: clear errors at once.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin";
use G4Test;
use PostgreSQL::Test::RecursiveCopy;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = G4Test::new_node('faults');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gemma4');
is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)'), 't', 'the model is ready');

my $pm_start = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
my $reference = $node->safe_psql('postgres', "SELECT gemma_generate('Hello world', max_tokens => 24)");

# An unrelated session with an open transaction, watched throughout.
my $bystander = $node->background_psql('postgres', on_error_stop => 0);
my $bystander_pid = $bystander->query_safe('SELECT pg_backend_pid()');
$bystander->query_safe('BEGIN');
$bystander->query_safe('CREATE TEMP TABLE kept (x int)');
$bystander->query_safe('INSERT INTO kept VALUES (1)');

# The session that runs the requests; errors must not end it.
my $s = $node->background_psql('postgres', on_error_stop => 0);
$s->query_safe('\set VERBOSITY verbose');
my $s_pid = $s->query_safe('SELECT pg_backend_pid()');

sub engine_pid
{
	return $node->safe_psql('postgres', 'SELECT engine_pid FROM gemma_stats');
}

sub wait_decoding
{
	return $node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM gemma_requests WHERE pid = $s_pid AND state = 'decode' AND generated_tokens > 3"
	);
}

# After a fault: nothing else was disturbed, the engine serves again.
sub check_recovered
{
	my ($what, $old_engine, $restarts) = @_;

	is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
		$pm_start, "$what: the postmaster did not restart");
	is($bystander->query_safe('SELECT pg_backend_pid()'),
		$bystander_pid, "$what: an unrelated session keeps its backend");
	$bystander->query_safe('INSERT INTO kept VALUES (1)');
	cmp_ok($bystander->query_safe('SELECT count(*) FROM kept'),
		'>=', 2, "$what: its transaction is still open");
	is($s->query_safe('SELECT pg_backend_pid()'), $s_pid, "$what: the failed session keeps its backend");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT worker_state = 'ready' AND engine_pid <> $old_engine AND engine_restarts = $restarts FROM gemma_stats"
		),
		"$what: a new engine process is ready (restart $restarts)");
	is($node->safe_psql('postgres', "SELECT gemma_generate('Hello world', max_tokens => 24)"),
		$reference, "$what: the new engine gives the same answer");
	ok(G4Test::wait_idle($node), "$what: the KV pool is empty");
}

# ---- kill -9 of the engine mid-request ------------------------------------
{
	my $old = engine_pid();
	G4Test::start_query($s, "SELECT length(gemma_generate('Hello world', max_tokens => 3000))");
	ok(wait_decoding(), 'mid-request: the request is decoding');
	kill 'KILL', $old;
	my $t0 = time;
	my ($out, $err) = G4Test::finish_query($s);
	my $elapsed = time - $t0;
	like($err, qr/ERROR:  58000: the gemma4 engine process was terminated by signal 9/,
		'mid-request: the session gets an error naming the signal');
	cmp_ok($elapsed, '<', 5, sprintf('mid-request: the error arrived within 5 s (%.2f s)', $elapsed));
	check_recovered('mid-request', $old, 1);
}

# ---- right after a kill, calls fail at once while the engine restarts ------
{
	my $old = engine_pid();
	kill 'KILL', $old;
	# once the supervisor has seen the death (the state leaves 'ready'), a
	# call within its restart delay (>= 250 ms) fails at once; a call sent
	# before it has seen the death is in flight and fails with 58000 instead
	my ($ret, $stdout, $stderr) = $node->psql('postgres',
		"DO \$\$ BEGIN WHILE (SELECT worker_state FROM gemma_stats) = 'ready' LOOP PERFORM pg_sleep(0.005); END LOOP; END \$\$; "
		  . "SELECT gemma_generate('Hello world', max_tokens => 4)",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($stderr, qr/ERROR:  55000: the gemma4 engine is restarting/,
		'during the restart: a call fails at once with 55000');
	like($stderr, qr/HINT:  Retry when SELECT gemma_wait_ready\(\) returns true/, 'during the restart: with a hint');
	check_recovered('restart window', $old, 2);
}

# ---- kill -9 of the engine mid-stream ---------------------------------------
{
	my $old = engine_pid();
	$s->query_safe('BEGIN');
	$s->query_safe("DECLARE c CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 3000)");
	my $rows = $s->query_safe('FETCH 5 FROM c');
	is(scalar(split /\n/, $rows), 5, 'mid-stream: rows arrive through the cursor');
	G4Test::start_query($s, 'FETCH ALL FROM c');
	ok(wait_decoding(), 'mid-stream: the stream is decoding');
	kill 'KILL', $old;
	my $t0 = time;
	my ($out, $err) = G4Test::finish_query($s);
	my $elapsed = time - $t0;
	like($err, qr/ERROR:  58000: the gemma4 engine process was terminated by signal 9/,
		'mid-stream: the reader gets an error');
	cmp_ok($elapsed, '<', 5, sprintf('mid-stream: the error arrived within 5 s (%.2f s)', $elapsed));
	$s->query_safe('ROLLBACK');
	check_recovered('mid-stream', $old, 3);
}

# ---- a killed engine process that is not collected at once -------------------
# A process stuck in the kernel (uninterruptible device I/O) outlives its
# SIGKILL for as long as that call lasts.  Here the test traces the engine
# process (ptrace): the zombie of a traced process is reported to its tracer
# first, and the supervisor, its parent, cannot collect it until the tracer
# has.  Meanwhile the supervisor goes on: the request in flight fails once,
# the views show the state, and no new engine starts before the old one is
# collected.
SKIP:
{
	my $old = engine_pid();
	my $traced = eval { require 'syscall.ph'; syscall(&SYS_ptrace, 0x4206, $old + 0, 0, 0) == 0 };    # PTRACE_SEIZE
	skip 'the test cannot trace the engine process (ptrace)', 12 unless $traced;
	my $errors = $node->safe_psql('postgres', 'SELECT errors FROM gemma_stats');
	my $t = $node->background_psql('postgres', on_error_stop => 0, timeout => 30);
	$t->query_safe('\set VERBOSITY verbose');
	my $t_pid = $t->query_safe('SELECT pg_backend_pid()');
	G4Test::start_query($t, "SELECT length(gemma_generate('Hello world', max_tokens => 3000))");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) > 0 FROM gemma_requests WHERE pid = $t_pid AND state = 'decode' AND generated_tokens > 3"),
		'not collected: the request is decoding');
	kill 'KILL', $old;
	my $t0 = time;
	my ($out, $err) = eval { G4Test::finish_query($t) };
	my $elapsed = time - $t0;
	like($err // "no answer: $@",
		qr/ERROR:  58000: the gemma4 engine process did not exit within 5000 ms of SIGKILL/,
		'not collected: the request in flight fails all the same');
	cmp_ok($elapsed, '<', 15, sprintf('not collected: within 15 s (%.2f s)', $elapsed));
	is($node->safe_psql('postgres', 'SELECT errors FROM gemma_stats'), $errors + 1, 'not collected: one error counted');
	like(
		$node->safe_psql('postgres', "SELECT worker_state || ' ' || engine_pid || ': ' || state_reason FROM gemma_stats"),
		qr/^restarting $old: The engine process \(PID $old\) was killed but has not exited/,
		'not collected: the view says the old process has not exited');
	sleep 1;
	is(engine_pid(), $old, 'not collected: no new engine process starts meanwhile');
	my ($ret, $stdout, $stderr) = $node->psql(
		'postgres', "SELECT gemma_generate('Hello world', max_tokens => 4)",
		extra_params => [ '-v', 'VERBOSITY=verbose' ],
		timeout => 30,
		timed_out => \my $timed_out);
	like($stderr, qr/ERROR:  55000: the gemma4 engine is restarting/, 'not collected: a new call fails at once');

	# the tracer collects the zombie; the supervisor hears of it and goes on
	is(waitpid($old, 0), $old, 'not collected: the test lets go of the process');
	is($t->query_safe('SELECT pg_backend_pid()'), $t_pid, 'not collected: the failed session keeps its backend');
	$t->quit;
	ok( $node->poll_query_until(
			'postgres', "SELECT worker_state = 'ready' AND engine_pid <> $old AND engine_restarts = 4 FROM gemma_stats"),
		'not collected: once it is, a new engine process is ready (restart 4)');
	is($node->safe_psql('postgres', 'SELECT errors FROM gemma_stats'),
		$errors + 1, 'not collected: collecting it fails nothing again');
	ok(!kill(0, $old), 'not collected: the old process is gone');
}

# ---- pg_cancel_backend mid-stream -------------------------------------------
{
	my $cancelled = $node->safe_psql('postgres', 'SELECT cancelled FROM gemma_stats');
	G4Test::start_query($s,
		"SELECT count(*) FROM (SELECT gemma_generate_stream('Hello world', max_tokens => 3000)) x");
	ok(wait_decoding(), 'pg_cancel_backend: the stream is decoding');
	$node->safe_psql('postgres', "SELECT pg_cancel_backend($s_pid)");
	my $t0 = time;
	my ($out, $err) = G4Test::finish_query($s);
	my $elapsed = time - $t0;
	like($err, qr/ERROR:  57014: canceling statement due to user request/,
		'pg_cancel_backend: the stream is cancelled');
	cmp_ok($elapsed, '<', 5, sprintf('pg_cancel_backend: within 5 s (%.2f s)', $elapsed));
	ok(G4Test::wait_idle($node), 'pg_cancel_backend: the KV pool is empty');
	cmp_ok($node->safe_psql('postgres', 'SELECT cancelled FROM gemma_stats'),
		'>', $cancelled, 'pg_cancel_backend: counted as cancelled');
	is($s->query_safe('SELECT pg_backend_pid()'), $s_pid, 'pg_cancel_backend: the session goes on');
}

# ---- statement_timeout --------------------------------------------------------
{
	$s->query_safe("SET statement_timeout = '500ms'");
	G4Test::start_query($s, "SELECT gemma_generate('Hello world', max_tokens => 3000)");
	my ($out, $err) = G4Test::finish_query($s);
	like($err, qr/ERROR:  57014: canceling statement due to statement timeout/,
		'statement_timeout: the request is cancelled');
	$s->query_safe('RESET statement_timeout');
	ok(G4Test::wait_idle($node), 'statement_timeout: the KV pool is empty');
}

# ---- a closed cursor --------------------------------------------------------
{
	$s->query_safe('BEGIN');
	$s->query_safe("DECLARE c CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 3000)");
	$s->query_safe('FETCH 2 FROM c');
	ok(wait_decoding(), 'closed cursor: the stream is decoding');
	cmp_ok($node->safe_psql('postgres', 'SELECT sum(blocks_used) FROM gemma_kv_pool'),
		'>', 0, 'closed cursor: the stream holds KV blocks');
	$s->query_safe('CLOSE c');
	ok(G4Test::wait_idle($node), 'closed cursor: the KV blocks are freed');
	$s->query_safe('COMMIT');
}

# ---- 1,000 failing calls leak nothing -----------------------------------------
{
	my $sup_pid = $node->safe_psql('postgres', 'SELECT worker_pid FROM gemma_stats');
	ok(G4Test::wait_idle($node), 'leak check: idle before');
	my $sup_maps = G4Test::dsm_mappings($sup_pid);
	my $s_maps = G4Test::dsm_mappings($s_pid);
	my $errors = $node->safe_psql('postgres', 'SELECT errors FROM gemma_stats');

	# the measure sees a request in flight: one segment on each side
	$s->query_safe('BEGIN');
	$s->query_safe("DECLARE c CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 3000)");
	$s->query_safe('FETCH 1 FROM c');
	is(G4Test::dsm_mappings($s_pid), $s_maps + 1, 'leak check: a request maps one segment in its session');
	is(G4Test::dsm_mappings($sup_pid), $sup_maps + 1, 'leak check: and one in the supervisor');
	$s->query_safe('CLOSE c');
	$s->query_safe('COMMIT');
	ok(G4Test::wait_idle($node), 'leak check: idle again');

	# four kinds of failure, 250 each: rejected in the backend, rejected by
	# the engine (bad token id, prompt too long), cancelled by a timeout
	my $caught = $s->query_safe(q{
DO $$
DECLARE
    caught int := 0;
BEGIN
    FOR i IN 1..1000 LOOP
        BEGIN
            CASE i % 4
                WHEN 0 THEN PERFORM gemma_generate('Hello', max_tokens => -1);
                WHEN 1 THEN PERFORM gemma_detokenize(ARRAY[99999999]);
                WHEN 2 THEN PERFORM gemma_generate(repeat('hello ', 5000), max_tokens => 4);
                ELSE
                    PERFORM set_config('gemma4.request_timeout', '1', true);
                    PERFORM gemma_generate('Hello world', max_tokens => 3000);
            END CASE;
        EXCEPTION WHEN others OR query_canceled THEN
            caught := caught + 1;
        END;
        PERFORM set_config('gemma4.request_timeout', '0', true);
    END LOOP;
    PERFORM set_config('g4.caught', caught::text, false);
END $$;
SELECT current_setting('g4.caught')});
	is($caught, '1000', 'leak check: all 1,000 calls failed');
	ok(G4Test::wait_idle($node), 'leak check: no request left, the KV pool is empty');
	is(G4Test::dsm_mappings($sup_pid), $sup_maps, 'leak check: the supervisor holds no request segment');
	is(G4Test::dsm_mappings($s_pid), $s_maps, 'leak check: the session holds no request segment');
	cmp_ok($node->safe_psql('postgres', 'SELECT errors FROM gemma_stats'),
		'>=', $errors + 500, 'leak check: the engine-side failures were counted');
	is($node->safe_psql('postgres', "SELECT gemma_generate('Hello world', max_tokens => 24)"),
		$reference, 'leak check: the engine still serves');
}

# ---- the supervisor terminated on its own ------------------------------------
{
	my $sup_pid = $node->safe_psql('postgres', 'SELECT worker_pid FROM gemma_stats');
	my $old = engine_pid();
	my $counters = 'SELECT tokens_out, steps FROM gemma_stats';
	my ($tokens_before, $steps_before) = split /\|/, $node->safe_psql('postgres', $counters);
	# it has no database connection, so pg_terminate_backend cannot reach it
	kill 'TERM', $sup_pid;
	ok( $node->poll_query_until(
			'postgres',
			"SELECT worker_state = 'ready' AND worker_pid <> $sup_pid AND engine_pid <> $old FROM gemma_stats"),
		'supervisor terminated: a new supervisor and engine are ready');
	ok(!kill(0, $old), 'supervisor terminated: the old engine process is gone');
	is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
		$pm_start, 'supervisor terminated: the postmaster did not restart');
	is($bystander->query_safe('SELECT pg_backend_pid()'),
		$bystander_pid, 'supervisor terminated: an unrelated session keeps its backend');
	is($node->safe_psql('postgres', "SELECT gemma_generate('Hello world', max_tokens => 24)"),
		$reference, 'supervisor terminated: it serves again');
	# the dead engine's counts stay in the totals, and the new one's add up
	ok( $tokens_before > 0
		  && $node->poll_query_until(
			'postgres',
			"SELECT tokens_out > $tokens_before AND steps > $steps_before FROM gemma_stats"),
		"supervisor terminated: the cumulative counters go on from $tokens_before tokens, $steps_before steps");
}

# ---- the supervisor terminated while a finished stream waits for its reader ---
# A cursor read one row at a time: the engine finishes the stream while most
# of it is still in the supervisor (about 4,000 pieces take some 85 kB in the
# 64 kB reply queue, the rest waits in the supervisor's buffer).  Terminating
# the supervisor then must end the stream with an error, never with a
# shorter answer that reads as complete.
{
	my $sup_pid = $node->safe_psql('postgres', 'SELECT worker_pid FROM gemma_stats');
	my ($finished_before, $errors_before) =
	  split /\|/, $node->safe_psql('postgres', 'SELECT finished, errors FROM gemma_stats');
	$s->query_safe('BEGIN');
	$s->query_safe("DECLARE c CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 4000)");
	$s->query_safe('FETCH 1 FROM c');
	ok( $node->poll_query_until(
			'postgres', "SELECT count(*) > 0 FROM gemma_requests WHERE pid = $s_pid AND state = 'finished'"),
		'slow reader: the engine finished the stream before it was read');
	kill 'TERM', $sup_pid;
	# the old supervisor is gone (it let go of every request before that)
	ok($node->poll_query_until('postgres', "SELECT worker_pid IS DISTINCT FROM $sup_pid FROM gemma_stats"),
		'slow reader: the supervisor stopped');
	G4Test::start_query($s, 'FETCH ALL FROM c');
	my ($out, $err) = G4Test::finish_query($s);
	like($err, qr/ERROR:  55000: the gemma4 worker is shutting down/,
		'slow reader: the rest of the stream ends with an error, not a truncated answer');
	is( $node->safe_psql('postgres', 'SELECT finished, errors FROM gemma_stats'),
		$finished_before . '|' . ($errors_before + 1),
		'slow reader: it counts as an error, not as finished too');
	$s->query_safe('ROLLBACK');
	ok( $node->poll_query_until(
			'postgres', "SELECT worker_state = 'ready' AND worker_pid <> $sup_pid FROM gemma_stats"),
		'slow reader: a new supervisor is ready');
	is($node->safe_psql('postgres', "SELECT gemma_generate('Hello world', max_tokens => 24)"),
		$reference, 'slow reader: it serves again');
	ok(G4Test::wait_idle($node), 'slow reader: the KV pool is empty');
}

$bystander->query_safe('COMMIT');
$bystander->quit;
$s->quit;

# ---- configurations that cannot serve ------------------------------------------
sub restart_with
{
	my ($conf) = @_;
	$node->stop;
	$node->append_conf('postgresql.conf', $conf);
	$node->start;
}

sub call_fails
{
	my ($what, $sql, $pattern) = @_;
	my $t0 = time;
	my ($ret, $stdout, $stderr) =
	  $node->psql('postgres', $sql, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	my $elapsed = time - $t0;
	like($stderr, $pattern, "$what: $sql fails");
	cmp_ok($elapsed, '<', 2, "$what: at once");
}

{
	# a model directory that does not exist yet
	my $later = $node->basedir . '/model-later';
	restart_with("gemma4.model_dir = '$later'");
	ok($node->poll_query_until('postgres', "SELECT worker_state = 'failed' FROM gemma_stats"),
		'bad model: the worker state is failed');
	like($node->safe_psql('postgres', 'SELECT state_reason FROM gemma_stats'),
		qr{\Q$later\E}, 'bad model: the reason names the path');
	call_fails('bad model', "SELECT gemma_generate('x')",
		qr/ERROR:  55000: the gemma4 model could not be loaded\n.*DETAIL:  Loading the model failed: .*model-later.*\n.*HINT:  Check gemma4.model_dir/s
	);
	is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(10000)'), 'f', 'bad model: gemma_wait_ready says no');

	# the model arrives; a reload retries the load
	PostgreSQL::Test::RecursiveCopy::copypath($ENV{G4_MODEL_DIR}, $later);
	$node->reload;
	is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)'), 't',
		'bad model: after the files arrive, a reload loads the model');
	is($node->safe_psql('postgres', "SELECT gemma_generate('Hello world', max_tokens => 24)"),
		$reference, 'bad model: then it serves');
}

SKIP:
{
	my $default = "$ENV{G4_SHAREDIR}/gemma4/default-model.gguf";
	skip 'a default model is installed', 3 if -e $default;
	restart_with("gemma4.model_dir = ''");
	ok($node->poll_query_until('postgres', "SELECT worker_state = 'failed' FROM gemma_stats"),
		'no model: the worker state is failed');
	call_fails('no model', "SELECT gemma_chat('[{\"role\": \"user\", \"content\": \"x\"}]')",
		qr/ERROR:  55000: the gemma4 model could not be loaded\n.*DETAIL:  gemma4.model_dir is not set and no default model is installed at .*default-model.gguf.*\n.*HINT:  Set gemma4.model_dir in postgresql.conf/s
	);
}

# The embedded default model: with gemma4.model_dir empty the worker serves
# <sharedir>/gemma4/default-model.gguf (Gemma 3 270M, real weights), which
# answers a factual question.
SKIP:
{
	my $gguf = $ENV{G4_DEFAULT_GGUF} // '';
	my $dir = "$ENV{G4_SHAREDIR}/gemma4";
	my $default = "$dir/default-model.gguf";
	skip 'the default model was not fetched (package registry unreachable)', 3 unless -f $gguf;
	skip 'the share directory is not writable (a system installation)', 3
	  unless -w $ENV{G4_SHAREDIR} && !-e $default;
	mkdir $dir;
	symlink($gguf, $default) or die "symlink: $!";
	restart_with("gemma4.model_dir = ''\ngemma4.max_model_len = 2048");
	is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(120000)'), 't', 'default model: it loads');
	like($node->safe_psql('postgres', 'SELECT architecture FROM gemma_stats'), qr/gemma3/,
		'default model: Gemma 3 270M is served');
	like(
		$node->safe_psql('postgres',
			"SELECT gemma_complete(E'Question: What is the capital of France?\\nAnswer:', max_tokens => 4)"),
		qr/Paris/, 'default model: the capital of France is Paris');
	unlink($default);
	rmdir $dir;
	$node->append_conf('postgresql.conf', 'gemma4.max_model_len = 4096');
}

{
	restart_with("shared_preload_libraries = ''");
	call_fails('not preloaded', "SELECT gemma_generate('x')",
		qr/ERROR:  55000: gemma4 must be loaded via shared_preload_libraries\n.*HINT:  Add gemma4 to shared_preload_libraries/s
	);
	call_fails('not preloaded', 'SELECT * FROM gemma_stats',
		qr/ERROR:  55000: gemma4 must be loaded via shared_preload_libraries/);
}

# Invalid values in postgresql.conf: PostgreSQL rejects them with a warning
# naming the parameter and keeps the default; SET and ALTER SYSTEM refuse
# them with an error.
{
	my @bad = (
		[ "gemma4.kv_cache_dtype = 'fp8'", qr/WARNING:  invalid value for parameter "gemma4.kv_cache_dtype": "fp8"/ ],
		[ 'gemma4.gpu_memory_utilization = 1.5',
		  qr/WARNING:  1.5 is outside the valid range for parameter "gemma4.gpu_memory_utilization"/ ],
		[ 'gemma4.max_num_seqs = 0', qr/WARNING:  0 is outside the valid range for parameter "gemma4.max_num_seqs"/ ],
		[ "gemma4.backend = 'tpu'", qr/WARNING:  invalid value for parameter "gemma4.backend": "tpu"/ ]);
	$node->stop;
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'gemma4'\ngemma4.model_dir = '$ENV{G4_MODEL_DIR}'\n"
		  . join("\n", map { $_->[0] } @bad));
	my $log_offset = -s $node->logfile;
	$node->start;
	my $log = slurp_file($node->logfile, $log_offset);
	for my $b (@bad)
	{
		like($log, $b->[1], "invalid setting $b->[0]: the log names the parameter");
	}
	is($node->safe_psql('postgres', 'SHOW gemma4.kv_cache_dtype'), 'turboquant_k8v4',
		'invalid setting: the default is kept');
	is($node->safe_psql('postgres', 'SHOW gemma4.backend'), 'auto',
		'invalid setting: the default backend is kept');
	my ($ret, $stdout, $stderr) = $node->psql('postgres', "ALTER SYSTEM SET gemma4.kv_cache_dtype = 'fp8'");
	like($stderr, qr/ERROR:  invalid value for parameter "gemma4.kv_cache_dtype": "fp8"/,
		'invalid setting: ALTER SYSTEM refuses it');
	($ret, $stdout, $stderr) = $node->psql('postgres', 'ALTER SYSTEM SET gemma4.max_model_len = 1');
	like($stderr, qr/ERROR:  1 is outside the valid range for parameter "gemma4.max_model_len"/,
		'invalid setting: ALTER SYSTEM checks ranges');
	my $conf = slurp_file($node->data_dir . '/postgresql.conf');
	$conf =~ s/^\Q$_->[0]\E\n?//mg for @bad;
	open my $fh, '>', $node->data_dir . '/postgresql.conf' or die;
	print $fh $conf;
	close $fh;
	$node->stop;
}

# back to a working configuration, with two request slots only, both for
# one role, and no waiting for a slot
{
	$node->append_conf('postgresql.conf',
		"gemma4.model_dir = '$ENV{G4_MODEL_DIR}'\ngemma4.max_requests = 2\n"
		  . "gemma4.max_requests_per_role = 2\ngemma4.queue_timeout = 0");
	$node->start;
	is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)'), 't', 'fixed configuration: ready again');
	is($node->safe_psql('postgres', "SELECT gemma_generate('Hello world', max_tokens => 24)"),
		$reference, 'fixed configuration: the same answer');

	# both slots held by open streams: a third request fails at once
	my @holders;
	for my $i (1 .. 2)
	{
		my $h = $node->background_psql('postgres');
		$h->query_safe('BEGIN');
		$h->query_safe("DECLARE c CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 3000)");
		$h->query_safe('FETCH 1 FROM c');
		push @holders, $h;
	}
	call_fails('slots exhausted', "SELECT gemma_generate('x', max_tokens => 4)",
		qr/ERROR:  53000: too many concurrent gemma4 requests: this role already holds its limit of 2 requests \(gemma4.max_requests_per_role\)\n.*DETAIL:  This role holds 2 of 2 request slots.*\n.*HINT:  Retry later; an administrator can raise gemma4.max_requests/s
	);
	$_->query_safe('ROLLBACK') for @holders;
	$_->quit for @holders;
	ok(G4Test::wait_idle($node), 'slots exhausted: the slots are free again');
	is($node->safe_psql('postgres', "SELECT gemma_generate('Hello world', max_tokens => 24)"),
		$reference, 'slots exhausted: a request runs again');

	# as many sessions as slots, each submitting again the moment its answer
	# arrives: a session's finished request never holds the slot it needs
	$node->pgbench(
		'--no-vacuum --client=2 --jobs=2 --transactions=60',
		0,
		[qr{processed: 120/120}],
		[qr{^$}],
		'slots: back-to-back requests from as many sessions as slots',
		{
			'002_back_to_back' => q{
SELECT gemma_complete('Hello', max_tokens => 1);
}
		});
}

$node->stop;
done_testing();
