# 003_jobs.pl — table jobs (gemma_job_create and friends).
#
#   - a job over 300 rows gives each row what gemma_generate gives it, the
#     progress view is consistent at every poll, the engine answers each row
#     exactly once, the worker is recognisable in pg_stat_activity;
#   - a row whose write fails goes to gemma_job_errors and the job goes on;
#   - pause, resume, cancel; a terminated worker is started again by the
#     next check of the running jobs, which also drops the triggers a
#     cancel could not;
#   - faults mid-job (kill -9 of the job worker, of the engine process,
#     pg_ctl restart -m immediate): the job completes, every row is written
#     exactly once, none is left;
#   - "keep up to date": rows changed during the job, and rows inserted
#     later, end with the answer to their current prompt, never a stale one;
#   - media columns: a row whose image changed while it was answered is
#     queued again and answered from its new image;
#   - a dropped table takes its jobs with it;
#   - pg_dump and restore: the jobs come back naming their table and role,
#     new ones are numbered after them, a paused one resumes there;
#   - privileges: a job cannot read what its creator cannot, another role
#     neither sees nor cancels it, a member of the creator's role does.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin";
use G4Test;
use PostgreSQL::Test::Utils;
use Test::More;

my $ROWS = 300;
my $GEN = "'{\"max_tokens\": 6}'";

# running jobs are checked for missing workers every second
my $node = G4Test::new_node("jobs",
	"max_worker_processes = 16\nrestart_after_crash = on\ngemma4.job_check_interval = 1\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gemma4');
is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)'), 't', 'the model is ready');

# A documents table, the answers gemma_generate gives row by row, and a log
# of every write of the target column.
$node->safe_psql(
	'postgres', qq{
CREATE TABLE docs (id int PRIMARY KEY, body text NOT NULL, summary text);
INSERT INTO docs SELECT i, 'document ' || i || ' about ' || (ARRAY['cats','dogs','rain','tea'])[1 + i % 4]
  FROM generate_series(1, $ROWS) i;
CREATE TABLE expected AS
  SELECT id, gemma_generate('Summarize: ' || body, max_tokens => 6) AS summary FROM docs;
CREATE TABLE writes (tbl text, id int);
CREATE FUNCTION log_write() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
  INSERT INTO writes VALUES (TG_TABLE_NAME, NEW.id);
  RETURN NULL;
END \$\$;
CREATE TRIGGER log_write AFTER UPDATE OF summary ON docs
  FOR EACH ROW WHEN (NEW.summary IS DISTINCT FROM OLD.summary) EXECUTE FUNCTION log_write();
});

# Poll the job until it is done; check the progress figures at each poll.
sub wait_job
{
	my ($job, $what, $total) = @_;
	my $bad = 0;
	my $last_done = 0;
	my $polls = 0;

	for (my $i = 0; $i < 1800; $i++)
	{
		my $row = $node->safe_psql('postgres',
			"SELECT state, rows_total, rows_done, rows_failed, rows_pending FROM gemma_jobs WHERE job = $job");
		my ($state, $t, $d, $f, $p) = split /\|/, $row;
		$polls++;
		# across a restart the counters restart from what was committed
		$bad++ if $t != $d + $f + $p || (defined $total && $t != $total);
		$last_done = $d;
		return ($state, $bad, $polls) if $state ne 'running';
		select(undef, undef, undef, 0.1);
	}
	return ('timeout', $bad, $polls);
}

sub finished_requests
{
	return $node->safe_psql('postgres', 'SELECT requests FROM gemma_stats');
}

sub check_filled
{
	my ($what) = @_;
	is( $node->safe_psql('postgres',
			'SELECT count(*) FROM docs d JOIN expected e USING (id) WHERE d.summary IS NOT DISTINCT FROM e.summary'),
		$ROWS,
		"$what: every row holds what gemma_generate gives it");
	is($node->safe_psql('postgres', "SELECT count(*) FROM writes WHERE tbl = 'docs'"),
		$ROWS, "$what: $ROWS writes");
	is($node->safe_psql('postgres', "SELECT count(DISTINCT id) FROM writes WHERE tbl = 'docs'"),
		$ROWS, "$what: each row written exactly once");
}

sub reset_docs
{
	$node->safe_psql('postgres', 'ALTER TABLE docs DISABLE TRIGGER log_write; UPDATE docs SET summary = NULL;'
		  . 'ALTER TABLE docs ENABLE TRIGGER log_write; TRUNCATE writes');
}

sub job_worker_pid
{
	my ($job) = @_;
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'gemma4 job worker' AND application_name = 'gemma4 job $job'"
	);
}

# Wait until no worker of the job is left.
sub no_worker_left
{
	my ($job) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'gemma4 job $job'");
}

# After a crash of a server process: until the postmaster has reset the
# cluster and accepts sessions again, a query may be cut or refused.  The
# postmaster learns of the crash asynchronously, so a session may still
# reach the old cluster first: the reset is over when an engine other than
# $old_engine (its pid before the crash) is ready.
sub wait_reconnected
{
	my ($old_engine) = @_;

	for (1 .. 600)
	{
		# psql, not safe_psql: a refused or cut connection is no error here
		my ($ret, $ready) = $node->psql('postgres', 'SELECT gemma_wait_ready(60000)');
		if ($ret == 0 && $ready eq 't')
		{
			my ($ret2, $engine) = $node->psql('postgres', 'SELECT engine_pid FROM gemma_stats');

			return if $ret2 == 0 && $engine ne '' && $engine ne $old_engine;
		}
		select(undef, undef, undef, 0.1);
	}
	die 'the server did not come back after the crash';
}

# A job over docs.  Its prompt expression sleeps 10 ms and adds nothing to
# the prompt (pg_sleep's void is the empty string); the worker evaluates it
# when it reads a row and again when it writes the answer, so a worker does
# at most ~50 rows a second however fast the engine answers, and a pause, a
# cancel or a fault lands while most rows are still to do (unpaced, a pause
# once took effect after 280 of the 300 rows: too few left to see the
# resumed job move).
sub start_job
{
	my ($workers) = @_;
	$workers //= 1;
	return $node->safe_psql('postgres',
		"SELECT gemma_job_create('docs', 'summary', \$\$'Summarize: ' || body || pg_sleep(0.01)::text\$\$, "
		  . "options => $GEN, workers => $workers)");
}

# ---- a job equals gemma_generate row by row ---------------------------------
{
	my $before = finished_requests();
	my $job = start_job();
	ok($node->poll_query_until('postgres',
			"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'gemma4 job worker' AND application_name = 'gemma4 job $job'"
		),
		'the job worker shows in pg_stat_activity');
	is($node->safe_psql('postgres', "SELECT workers, workers_running FROM gemma_jobs WHERE job = $job"),
		'1|1', 'the progress view counts it');
	my ($state, $bad, $polls) = wait_job($job, 'plain', $ROWS);
	is($state, 'done', 'the job is done');
	is($bad, 0, "progress was consistent at each of $polls polls");
	check_filled('plain job');
	is(finished_requests() - $before, $ROWS, 'the engine was asked for each row exactly once');
	is( $node->safe_psql('postgres',
			"SELECT rows_total, rows_done, rows_failed, rows_pending, tokens_in > 0, tokens_out > 0 FROM gemma_jobs WHERE job = $job"
		),
		"$ROWS|$ROWS|0|0|t|t",
		'the final progress figures');
	ok($node->poll_query_until('postgres',
			"SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'gemma4 job worker'"),
		'the worker exits when the job is done');
}

# ---- a row that cannot be written fails alone -------------------------------
{
	$node->safe_psql('postgres', 'CREATE TABLE small (id int PRIMARY KEY, body text, summary text CHECK (id <> 7 OR summary IS NULL));'
		  . "INSERT INTO small SELECT i, 'note ' || i FROM generate_series(1, 20) i");
	my $job = $node->safe_psql('postgres',
		"SELECT gemma_job_create('small', 'summary', 'body', options => $GEN)");
	my ($state) = wait_job($job, 'errors');
	is($state, 'done', 'errors: the job goes on to the end');
	is($node->safe_psql('postgres', "SELECT rows_done, rows_failed FROM gemma_jobs WHERE job = $job"),
		'19|1', 'errors: 19 rows done, 1 failed');
	is($node->safe_psql('postgres', "SELECT row_key, sqlstate FROM gemma_job_errors WHERE job_id = $job"),
		'7|23514', 'errors: the row, with its SQLSTATE');
	like($node->safe_psql('postgres', "SELECT last_error FROM gemma_jobs WHERE job = $job"),
		qr/row 7: .*check constraint/, 'errors: the last error in the progress view');
}

# ---- pause, resume, cancel -------------------------------------------------
{
	reset_docs();
	my $job = start_job();
	$node->poll_query_until('postgres', "SELECT rows_done > 20 FROM gemma_jobs WHERE job = $job");
	$node->safe_psql('postgres', "SELECT gemma_job_pause($job)");
	ok(no_worker_left($job),
		'pause: the worker stops');
	my $done = $node->safe_psql('postgres', "SELECT rows_done FROM gemma_jobs WHERE job = $job");
	note("pause: paused after $done of $ROWS rows");
	sleep 1;
	is($node->safe_psql('postgres', "SELECT state, rows_done, rows_in_progress FROM gemma_jobs WHERE job = $job"),
		"paused|$done|0", 'pause: nothing moves, nothing is claimed');
	$node->safe_psql('postgres', "SELECT gemma_job_resume($job)");
	$node->poll_query_until('postgres', "SELECT rows_done > $done + 20 FROM gemma_jobs WHERE job = $job");
	# a worker terminated by hand: the next check starts another
	my $pid = job_worker_pid($job);
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'gemma4 job $job' AND pid <> $pid"),
		'terminate: another worker takes the job over');
	my ($state) = wait_job($job, 'resume', $ROWS);
	is($state, 'done', 'resume: the job completes');
	check_filled('pause, resume and a terminated worker');

	reset_docs();
	$job = start_job();
	$node->poll_query_until('postgres', "SELECT rows_done > 20 FROM gemma_jobs WHERE job = $job");
	$node->safe_psql('postgres', "SELECT gemma_job_cancel($job)");
	ok(no_worker_left($job),
		'cancel: the worker stops');
	is($node->safe_psql('postgres', "SELECT state, rows_pending FROM gemma_jobs WHERE job = $job"),
		'cancelled|0', 'cancel: nothing left queued');
	# a key a follow job's trigger queued in a transaction open during the
	# cancel, which the cancel could not see: the next check deletes it
	$node->safe_psql('postgres', "INSERT INTO gemma_job_queue (job_id, key) VALUES ($job, '1')");
	ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM gemma_job_queue WHERE job_id = $job"),
		'cancel: a key queued after the cancel is deleted by the next check');
	my ($ret, $out, $err) = $node->psql('postgres', "SELECT gemma_job_resume($job)");
	like($err, qr/is cancelled, not paused or failed/, 'cancel: a cancelled job cannot resume');

	# a cancel while the worker writes answers: its write transaction is
	# held inside the update of its first row (a trigger waits on an
	# advisory lock held here), that row's queue entry already taken; the
	# cancel is issued then, and the lock released.  Neither may meet a
	# deadlock (the worker as its victim shows only in the server's log),
	# and what was written before the cancel is counted.
	reset_docs();
	$node->safe_psql(
		'postgres', q{
CREATE FUNCTION gate_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_lock_shared(4243);
  PERFORM pg_advisory_unlock_shared(4243);
  RETURN NEW;
END $$;
CREATE TRIGGER gate_write BEFORE UPDATE OF summary ON docs FOR EACH ROW EXECUTE FUNCTION gate_write();
});
	my $gate = $node->background_psql('postgres');
	$gate->query_safe('SELECT pg_advisory_lock(4243)');
	my $log_offset = -s $node->logfile;
	$job = start_job();
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'gemma4 job worker' AND wait_event = 'advisory'"
		),
		'cancel while answers are written: the worker waits inside its write');
	my $canceller = $node->background_psql('postgres', on_error_stop => 0);
	G4Test::start_query($canceller, "SELECT gemma_job_cancel($job)");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE 'SELECT gemma_job_cancel%' AND wait_event_type = 'Lock'"
		),
		'cancel while answers are written: the cancel waits for the write');
	$gate->query_safe('SELECT pg_advisory_unlock(4243)');
	$gate->quit;
	(undef, $err) = G4Test::finish_query($canceller);
	$canceller->quit;
	is($err, '', 'cancel while answers are written: the cancel succeeds');
	ok(no_worker_left($job),
		'cancel while answers are written: the worker stops');
	ok(!$node->log_contains(qr/deadlock detected/, $log_offset), 'cancel while answers are written: no deadlock');
	my $written = $node->safe_psql('postgres', "SELECT count(*) FROM writes WHERE tbl = 'docs'");
	is( $node->safe_psql('postgres',
			"SELECT state, rows_pending, rows_done = $written, $written > 0 FROM gemma_jobs WHERE job = $job"),
		'cancelled|0|t|t', 'cancel while answers are written: nothing queued, the write before the cancel counted');
	$node->safe_psql('postgres', 'DROP TRIGGER gate_write ON docs; DROP FUNCTION gate_write()');
}

# ---- faults mid-job ---------------------------------------------------------
sub fault
{
	my ($what, $action, $workers) = @_;
	reset_docs();
	my $job = start_job($workers);
	$node->poll_query_until('postgres', "SELECT rows_done > 60 FROM gemma_jobs WHERE job = $job");
	$action->($job);
	my ($state) = wait_job($job, $what);
	is($state, 'done', "$what: the job completes");
	is($node->safe_psql('postgres', "SELECT rows_total, rows_done, rows_pending FROM gemma_jobs WHERE job = $job"),
		"$ROWS|$ROWS|0", "$what: every row done, none left");
	check_filled($what);
}

fault('kill -9 of the job worker', sub {
	my ($job) = @_;
	my $pid = job_worker_pid($job);
	my $engine = $node->safe_psql('postgres', 'SELECT engine_pid FROM gemma_stats');
	ok($pid > 0, 'kill -9 of the job worker: it runs');
	kill 'KILL', $pid;
	# the postmaster resets the cluster (every session is cut, a query under
	# way included, and the engine restarts); the supervisor's launcher
	# resumes the job
	wait_reconnected($engine);
});

fault('kill -9 of the engine process', sub {
	my ($job) = @_;
	my $restarts = $node->safe_psql('postgres', 'SELECT engine_restarts FROM gemma_stats');
	kill 'KILL', $node->safe_psql('postgres', 'SELECT engine_pid FROM gemma_stats');
	ok($node->poll_query_until('postgres', "SELECT engine_restarts > $restarts FROM gemma_stats"),
		'kill -9 of the engine process: the engine restarts');
});

# with two workers sharing the queue
fault('restart -m immediate', sub {
	my ($job) = @_;
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'gemma4 job $job'"),
		'2', 'restart -m immediate: the job has two workers');
	$node->stop('immediate');
	$node->start;
	$node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)');
}, 2);

# ---- keep up to date: changed and new rows, never a stale answer -----------
{
	reset_docs();
	my $job = $node->safe_psql('postgres',
		"SELECT gemma_job_create('docs', 'summary', \$\$'Summarize: ' || body\$\$, options => $GEN, follow => true)");
	# change rows while the job runs, some of them while they are generated
	my $changed_in_flight = 0;
	for my $round (1 .. 10)
	{
		$changed_in_flight += $node->safe_psql('postgres',
			"WITH c AS (SELECT key::int AS id FROM gemma_job_queue WHERE job_id = $job AND claimed_by IS NOT NULL LIMIT 3), "
			  . "u AS (UPDATE docs SET body = body || ' v$round' WHERE id % 25 = $round % 25 OR id IN (SELECT id FROM c) RETURNING id) "
			  . "SELECT count(*) FROM u WHERE id IN (SELECT id FROM c)");
		select(undef, undef, undef, 0.2);
	}
	cmp_ok($changed_in_flight, '>', 0, "follow: $changed_in_flight rows changed while they were generated");
	$node->safe_psql('postgres', "INSERT INTO docs VALUES (1001, 'a late document about tea')");
	ok($node->poll_query_until('postgres',
			"SELECT rows_pending = 0 AND state = 'running' FROM gemma_jobs WHERE job = $job"),
		'follow: the queue drains, the job keeps running');
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM docs WHERE summary IS DISTINCT FROM gemma_generate('Summarize: ' || body, max_tokens => 6)"
		),
		0,
		'follow: every row holds the answer to its current prompt');
	$node->safe_psql('postgres', "SELECT gemma_job_cancel($job); DELETE FROM docs WHERE id = 1001");
}

# ---- keep up to date from the first moment ------------------------------------
# A row inserted by a transaction still open while a follow job is created
# is answered: the job's triggers wait for that transaction, and the
# queue's fill then sees its row.
{
	$node->safe_psql('postgres',
		"CREATE TABLE early (id int PRIMARY KEY, body text NOT NULL, summary text); INSERT INTO early VALUES (1, 'first')");
	my $writer = $node->background_psql('postgres', on_error_stop => 1);
	$writer->query_safe('BEGIN');
	$writer->query_safe("INSERT INTO early VALUES (2, 'written while the job is created')");
	my $creator = $node->background_psql('postgres', on_error_stop => 1);
	G4Test::start_query($creator,
		"SELECT gemma_job_create('early', 'summary', 'body', options => $GEN, follow => true)");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%gemma_job_create(''early''%'"
		),
		'early: creating the job waits for the open transaction');
	$writer->query_safe('COMMIT');
	my ($job) = G4Test::finish_query($creator);
	$job =~ s/\D//g;
	ok($node->poll_query_until('postgres', 'SELECT count(*) = 2 FROM early WHERE summary IS NOT NULL'),
		'early: both rows are answered, the one written meanwhile too');
	$node->safe_psql('postgres', "SELECT gemma_job_cancel($job)");
	$writer->quit;
	$creator->quit;
}

# ---- keep up to date over a table that stamps its rows -----------------------
# A BEFORE UPDATE trigger (updated_at) and a generated column change along
# with each answer the job writes: that is no change to answer again.
{
	$node->safe_psql(
		'postgres', q{
CREATE TABLE stamped (id int PRIMARY KEY, body text NOT NULL, summary text,
                      summary_len int GENERATED ALWAYS AS (length(summary)) STORED, updated_at timestamptz);
CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.updated_at := clock_timestamp();
  RETURN NEW;
END $$;
CREATE TRIGGER stamp BEFORE UPDATE ON stamped FOR EACH ROW EXECUTE FUNCTION stamp();
INSERT INTO stamped (id, body) SELECT i, 'stamped note ' || i FROM generate_series(1, 3) i;
});
	my $job = $node->safe_psql('postgres',
		"SELECT gemma_job_create('stamped', 'summary', 'body', options => $GEN, follow => true)");
	ok($node->poll_query_until('postgres',
			"SELECT rows_done >= 3 AND rows_pending = 0 FROM gemma_jobs WHERE job = $job"),
		'stamped: the three rows are answered');
	sleep 2;
	is($node->safe_psql('postgres', "SELECT rows_done, rows_pending FROM gemma_jobs WHERE job = $job"),
		'3|0', 'stamped: each once, none queued again by its own write');
	$node->safe_psql('postgres', "UPDATE stamped SET body = 'changed' WHERE id = 2");
	ok($node->poll_query_until('postgres',
			"SELECT rows_done = 4 AND rows_pending = 0 FROM gemma_jobs WHERE job = $job"),
		'stamped: a row changed by a user is answered again');
	$node->safe_psql('postgres', "SELECT gemma_job_cancel($job)");
}

# ---- media: an image changed while it was answered ------------------------
{
	my $media = "$FindBin::RealBin/../../fixtures/media";
	$node->safe_psql(
		'postgres', qq{
CREATE TABLE photos (id int PRIMARY KEY, photo bytea, caption text);
INSERT INTO photos VALUES (1, pg_read_binary_file('$media/rgb_48x48.png')),
                          (2, pg_read_binary_file('$media/grey_50x50.gif'));
CREATE TABLE photo_answers AS
  SELECT gemma_generate('Describe it.', ARRAY[pg_read_binary_file('$media/rgb_48x48.png')], max_tokens => 6) AS old,
         gemma_generate('Describe it.', ARRAY[pg_read_binary_file('$media/rgb_64x64.png')], max_tokens => 6) AS new;
});
	is($node->safe_psql('postgres', 'SELECT old <> new FROM photo_answers'), 't', 'media: the two images give different answers');
	# row 1 is locked here, so its answer waits to be written; the image
	# changes meanwhile
	my $holder = $node->background_psql('postgres');
	$holder->query_safe('BEGIN; SELECT FROM photos WHERE id = 1 FOR UPDATE');
	my $finished = $node->safe_psql('postgres', 'SELECT finished FROM gemma_stats');
	my $job = $node->safe_psql('postgres',
		"SELECT gemma_job_create('photos', 'caption', \$\$'Describe it.'\$\$, images => 'photo', options => $GEN)");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT s.finished = $finished + 2 AND j.rows_done = 1 FROM gemma_stats s, gemma_jobs j WHERE j.job = $job"),
		'media: both rows answered, row 1 waits to be written');
	$holder->query_safe("UPDATE photos SET photo = pg_read_binary_file('$media/rgb_64x64.png') WHERE id = 1; COMMIT");
	$holder->quit;
	my ($state) = wait_job($job, 'media', 2);
	is($state, 'done', 'media: the job is done');
	is($node->safe_psql('postgres', 'SELECT p.caption = a.new FROM photos p, photo_answers a WHERE p.id = 1'),
		't', 'media: the changed row holds the answer to its new image, not the stale one');
	is($node->safe_psql('postgres', 'SELECT finished FROM gemma_stats'),
		$finished + 3, 'media: the changed row was answered again, once');
	$node->safe_psql('postgres', 'DROP TABLE photos, photo_answers');
}

# ---- a dropped table ----------------------------------------------------------
# A job goes with its table: dropped mid-job, the worker leaves and the
# next check deletes the job.
{
	$node->safe_psql('postgres',
		"CREATE TABLE gone (id int PRIMARY KEY, body text, summary text); INSERT INTO gone SELECT i, 'x' || i FROM generate_series(1, 200) i"
	);
	my $job = $node->safe_psql('postgres',
		"SELECT gemma_job_create('gone', 'summary', \$\$body || pg_sleep(0.01)::text\$\$, options => $GEN)");
	$node->poll_query_until('postgres', "SELECT rows_done > 5 FROM gemma_jobs WHERE job = $job");
	$node->safe_psql('postgres', 'DROP TABLE gone');
	ok(no_worker_left($job),
		'dropped table: the worker leaves');
	ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM gemma_job WHERE id = $job"),
		'dropped table: the next check deletes its job');
}

# ---- pg_dump and restore -------------------------------------------------------
# The jobs are the database's data: a dump keeps them, naming their table
# and role (not their OIDs, which the restored ones do not share), and the
# sequence of their ids.  A paused job restored elsewhere resumes there.
{
	my $file = PostgreSQL::Test::Utils::tempdir() . '/jobs.sql';
	my $me = $node->safe_psql('postgres', 'SELECT current_user');
	$node->safe_psql('postgres', 'CREATE DATABASE dump_src');
	$node->safe_psql('postgres', 'CREATE DATABASE dump_dst');
	$node->safe_psql(
		'dump_src', qq{
CREATE EXTENSION gemma4;
CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL, summary text);
INSERT INTO notes SELECT i, 'note ' || i FROM generate_series(1, 12) i;
});
	my $done = $node->safe_psql('dump_src',
		"SELECT gemma_job_create('notes', 'summary', 'body', condition => 'id <= 2', options => $GEN)");
	ok($node->poll_query_until('dump_src', "SELECT state = 'done' FROM gemma_jobs WHERE job = $done"),
		'dump: the first job completes');
	# paused in the transaction that creates it: its workers find it paused
	my $paused = $node->safe_psql('dump_src',
		"SELECT c.j FROM (SELECT gemma_job_create('notes', 'summary', 'body', condition => 'id > 2', "
		  . "options => $GEN) AS j OFFSET 0) c CROSS JOIN LATERAL gemma_job_pause(c.j)");
	$node->command_ok([ 'pg_dump', '-f', $file, 'dump_src' ], 'dump: pg_dump writes the database');
	$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', 'dump_dst', '-f', $file ],
		'dump: psql restores it into another database');
	is( $node->safe_psql(
			'dump_dst',
			"SELECT string_agg(job || ' ' || relation || ' ' || owner || ' ' || state, ', ' ORDER BY job) FROM gemma_jobs"),
		"$done notes $me done, $paused notes $me paused",
		'dump: the restored jobs name their table and role');
	is($node->safe_psql('dump_dst', "SELECT count(*) FROM gemma_job WHERE relid = 'notes'::regclass"),
		'2', 'dump: they refer to the restored table');
	is( $node->safe_psql(
			'dump_dst', "SELECT gemma_job_create('notes', 'summary', 'body', condition => 'false') > $paused"),
		't', 'dump: a new job is numbered after them');
	$node->safe_psql('dump_dst', "SELECT gemma_job_resume($paused)");
	ok($node->poll_query_until('dump_dst', "SELECT state = 'done' FROM gemma_jobs WHERE job = $paused"),
		'dump: the paused job resumes in the restored database');
	is($node->safe_psql('dump_dst', 'SELECT count(*) FROM notes WHERE summary IS NOT NULL'),
		'12', 'dump: it answers the restored table');
	is($node->safe_psql('dump_src', 'SELECT count(*) FROM notes WHERE summary IS NOT NULL'),
		'2', 'dump: and not the table it was dumped from');

	# a database owner who is not a superuser: the job tables' row-level
	# security stops a plain pg_dump; with --enable-row-security it dumps
	# the jobs the role can see
	$node->safe_psql('postgres', 'CREATE ROLE erin LOGIN; CREATE DATABASE erin_db OWNER erin');
	$node->safe_psql('erin_db', 'CREATE EXTENSION gemma4; GRANT gemma_user TO erin');
	my $ejob = $node->safe_psql('erin_db',
		'SET ROLE erin; CREATE TABLE t (id int PRIMARY KEY, body text, summary text);'
		  . "SELECT gemma_job_create('t', 'summary', 'body', condition => 'false')");
	$node->command_fails_like([ 'pg_dump', '-U', 'erin', '-f', "$file.erin", 'erin_db' ],
		qr/row-level security policy for table "gemma_job"/,
		'dump: a plain pg_dump by a database owner who is not a superuser stops at the job tables');
	$node->command_ok([ 'pg_dump', '-U', 'erin', '--enable-row-security', '-f', "$file.erin", 'erin_db' ],
		'dump: with --enable-row-security it writes the database');
	like(slurp_file("$file.erin"), qr/^$ejob\terin\tpublic\.t\t/m, 'dump: with the jobs of that role');
}

# ---- privileges -------------------------------------------------------------
{
	$node->safe_psql(
		'postgres', q{
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE ROLE carol LOGIN IN ROLE alice;
GRANT gemma_user TO alice, bob;
CREATE TABLE secret (id int PRIMARY KEY, body text, summary text);
INSERT INTO secret VALUES (1, 'the password');
CREATE TABLE shared_docs (id int PRIMARY KEY, body text, owner name, summary text);
INSERT INTO shared_docs SELECT i, 'note ' || i, CASE WHEN i <= 5 THEN 'alice' ELSE 'bob' END, NULL
  FROM generate_series(1, 10) i;
GRANT SELECT, UPDATE ON shared_docs TO alice;
ALTER TABLE shared_docs ENABLE ROW LEVEL SECURITY;
CREATE POLICY mine ON shared_docs USING (owner = current_user);
});
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET ROLE alice; SELECT gemma_job_create('secret', 'summary', 'body')");
	like($err, qr/permission denied for table secret/, 'privileges: no job over a table its creator cannot read');

	my $job = $node->safe_psql('postgres',
		"SET ROLE alice; SELECT gemma_job_create('shared_docs', 'summary', 'body', options => $GEN)");
	my ($state) = wait_job($job, 'rls');
	is($state, 'done', 'privileges: the job of alice completes');
	is($node->safe_psql('postgres', 'SELECT string_agg(id::text, \',\' ORDER BY id) FROM shared_docs WHERE summary IS NOT NULL'),
		'1,2,3,4,5', 'privileges: row-level security applies to the job');
	is($node->safe_psql('postgres', 'SET ROLE bob; SELECT count(*) FROM gemma_jobs'),
		'0', 'privileges: another role sees no job');
	($ret, $out, $err) = $node->psql('postgres', "SET ROLE bob; SELECT gemma_job_cancel($job)");
	like($err, qr/gemma job $job does not exist/, 'privileges: another role cannot cancel it');
	($ret, $out, $err) = $node->psql('postgres', "SET ROLE bob; UPDATE gemma_job SET state = 'cancelled'");
	is($node->safe_psql('postgres', "SELECT state FROM gemma_jobs WHERE job = $job"),
		'done', 'privileges: nor change it directly');
	is($node->safe_psql('postgres', "SET ROLE carol; SELECT owner FROM gemma_jobs WHERE job = $job"),
		'alice', 'privileges: a member of the role sees it');

	# the keep-up-to-date trigger runs as the extension's owner: a key of a
	# type alice owns, with a cast to text of her own, must not run as it
	$node->safe_psql('postgres', 'CREATE SCHEMA alice_s AUTHORIZATION alice');
	$node->safe_psql(
		'postgres', q{
SET ROLE alice;
CREATE TYPE alice_s.k AS (v int);
CREATE FUNCTION alice_s.k_text(alice_s.k) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  IF current_user <> 'alice' THEN
    EXECUTE 'ALTER ROLE alice SUPERUSER';
  END IF;
  RETURN ($1).v::text;
END $$;
CREATE CAST (alice_s.k AS text) WITH FUNCTION alice_s.k_text(alice_s.k);
CREATE TABLE alice_s.t (id alice_s.k NOT NULL UNIQUE, body text, answer text);
});
	my $fjob = $node->safe_psql('postgres',
		"SET ROLE alice; SELECT gemma_job_create('alice_s.t', 'answer', 'body', key => 'id', follow => true, options => $GEN)");
	$node->safe_psql('postgres', "SET ROLE alice; INSERT INTO alice_s.t VALUES (ROW(1), 'x', NULL)");
	is($node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'alice'"),
		'f', "privileges: the trigger runs no cast of the key's type as the extension's owner");
	ok($node->poll_query_until('postgres', 'SELECT answer IS NOT NULL FROM alice_s.t'),
		'privileges: the row inserted into the followed table is answered');
	$node->safe_psql('postgres', "SET ROLE alice; SELECT gemma_job_cancel($fjob)");

	# an owner who can no longer log in: no worker could run the job, so
	# resuming it is refused and it stays paused
	$node->safe_psql('postgres',
		"CREATE TABLE bob_docs (id int PRIMARY KEY, body text, summary text); INSERT INTO bob_docs VALUES (1, 'x');"
		  . 'GRANT SELECT, UPDATE ON bob_docs TO bob');
	my $bjob = $node->safe_psql('postgres',
		"SET ROLE bob; SELECT c.j FROM (SELECT gemma_job_create('bob_docs', 'summary', 'body', options => $GEN) AS j "
		  . "OFFSET 0) c CROSS JOIN LATERAL gemma_job_pause(c.j)");
	$node->safe_psql('postgres', 'ALTER ROLE bob NOLOGIN');
	($ret, $out, $err) = $node->psql('postgres', "SELECT gemma_job_resume($bjob)",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  55000: the owner of gemma job $bjob, bob, cannot log in/,
		'privileges: a job whose owner cannot log in is not resumed');
	is($node->safe_psql('postgres', "SELECT state FROM gemma_jobs WHERE job = $bjob"),
		'paused', 'privileges: it stays paused');
	$node->safe_psql('postgres', 'ALTER ROLE bob LOGIN');
	$node->safe_psql('postgres', "SELECT gemma_job_resume($bjob)");
	ok($node->poll_query_until('postgres', "SELECT state = 'done' FROM gemma_jobs WHERE job = $bjob"),
		'privileges: once it can, the job resumes and completes');

	# a follow job over a table its creator may add triggers to but does not
	# own: the cancel cannot drop the triggers (only the owner may), the
	# next check does
	$node->safe_psql('postgres',
		'CREATE TABLE bob_follow (id int PRIMARY KEY, body text, summary text);'
		  . 'GRANT SELECT, UPDATE, TRIGGER ON bob_follow TO bob');
	my $fjob2 = $node->safe_psql('postgres',
		"SET ROLE bob; SELECT gemma_job_create('bob_follow', 'summary', 'body', follow => true, options => $GEN)");
	my $triggers = "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'bob_follow'::regclass AND tgname LIKE 'gemma_job_%'";
	is( $node->safe_psql(
			'postgres', "BEGIN; SET ROLE bob; SELECT gemma_job_cancel($fjob2); RESET ROLE; $triggers; COMMIT"),
		"\n2", 'privileges: a cancel by a role that does not own the table leaves its triggers');
	ok($node->poll_query_until('postgres', "SELECT ($triggers) = 0"), 'privileges: the next check drops them');
}

done_testing();
