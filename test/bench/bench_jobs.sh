#!/usr/bin/env bash
# test/bench/bench_jobs.sh — a table job against the same prompts sent by one
# batch call, on a running server with the gemma4 extension.
#
#   PSQL="psql -X -At -d postgres" ROWS=64 DOC_WORDS=60 PREFIX_WORDS=120 MAX_TOKENS=16 \
#     test/bench/bench_jobs.sh
#
# Each row's prompt is a shared instruction (PREFIX_WORDS words) followed by
# its own document (DOC_WORDS words), completed as raw text (completion =>
# true, like gemma_complete: the default model is a pretrained one); greedy,
# MAX_TOKENS at most.  Prints rows/s and generated tokens/s through the job
# system, then through gemma_complete_batch over the same prompts (the
# engine fed directly, as many requests in flight as the job keeps), and the
# prompt sizes in tokens.
set -euo pipefail
PSQL=${PSQL:-psql -X -At}
ROWS=${ROWS:-64}
DOC_WORDS=${DOC_WORDS:-60}
PREFIX_WORDS=${PREFIX_WORDS:-120}
MAX_TOKENS=${MAX_TOKENS:-16}
q() { $PSQL -c "$1"; }

q "DROP TABLE IF EXISTS bench_docs; CREATE TABLE bench_docs (id int PRIMARY KEY, body text NOT NULL, answer text);
   CREATE OR REPLACE FUNCTION bench_words(seed int, n int) RETURNS text LANGUAGE sql IMMUTABLE AS \$\$
     SELECT string_agg((ARRAY['table','index','row','page','vacuum','query','plan','lock','commit','backup',
                              'replica','column','schema','trigger','cursor','join','sort','hash','tuple','buffer'])
                       [1 + ((seed * 7919 + i * 104729) % 20)], ' ') FROM generate_series(1, n) i \$\$;
   INSERT INTO bench_docs SELECT i, bench_words(i, $DOC_WORDS) FROM generate_series(1, $ROWS) i;" >/dev/null
prefix="Read the notes below about a database and write a short title for them. $(q "SELECT bench_words(0, $PREFIX_WORDS)")"
prompt="'$prefix' || E'\\n\\nNotes: ' || body || E'\\nTitle:'"
tokens=$(q "SELECT round(avg(cardinality(gemma_tokenize($prompt)))) FROM bench_docs WHERE id <= 8")
echo "rows $ROWS, prompt $tokens tokens (shared prefix of $PREFIX_WORDS words), max_tokens $MAX_TOKENS"

stats() { q "SELECT tokens_out || ' ' || steps || ' ' || round(mean_batch_size::numeric * steps) FROM gemma_stats"; }
report() {
  local what=$1 t0=$2 t1=$3 before=$4 after=$5
  awk -v w="$what" -v r="$ROWS" -v a="$t0" -v b="$t1" -v s0="$before" -v s1="$after" 'BEGIN {
    split(s0, x, " "); split(s1, y, " "); n = y[1] - x[1]; st = y[2] - x[2]; bs = y[3] - x[3];
    printf "%-22s %6.1f s  %7.2f rows/s  %8.1f generated tokens/s  mean batch %.1f\n",
           w, b - a, r / (b - a), n / (b - a), (st > 0 ? bs / st : 0) }'
}

# through the job system
before=$(stats); t0=$(date +%s.%N)
job=$(q "SELECT gemma_job_create('bench_docs', 'answer', \$q\$$prompt\$q\$, completion => true,
         options => '{\"max_tokens\": $MAX_TOKENS}')")
while [ "$(q "SELECT state FROM gemma_jobs WHERE job = $job")" = running ]; do sleep 0.2; done
t1=$(date +%s.%N); after=$(stats)
report "job" "$t0" "$t1" "$before" "$after"
q "SELECT 'job ' || state || ': ' || rows_done || ' done, ' || rows_failed || ' failed' FROM gemma_jobs WHERE job = $job"

# the same prompts through one batch call
before=$(stats); t0=$(date +%s.%N)
q "SELECT count(*) FROM unnest((SELECT gemma_complete_batch(array_agg($prompt ORDER BY id), max_tokens => $MAX_TOKENS) FROM bench_docs))" >/dev/null
t1=$(date +%s.%N); after=$(stats)
report "gemma_complete_batch" "$t0" "$t1" "$before" "$after"
