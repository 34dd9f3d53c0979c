#!/usr/bin/env bash
# Table jobs on the GPU machine: a job over ROWS rows (default 10,000) whose
# prompts are a shared instruction prefix (about 1,000 tokens) and a document
# (about 500 tokens), through the job system and through gemma_complete_batch
# over the same prompts (the engine fed directly), at the same engine batch
# (gemma4.max_num_seqs = 64); rows/s and generated tokens/s of each
# (test/bench/bench_jobs.sh).  The printed prompt size is measured with the
# served model's tokenizer: adjust PREFIX_WORDS and DOC_WORDS to hit the
# sizes wanted.
#   usage (on the GPU machine, from the repository root):
#     test/gpu/pg-jobs.sh [OUT_DIR]
set -euo pipefail
out=${1:-/tmp/pg-jobs}
mkdir -p "$out"
# enough request slots for the job's 96 requests in flight and the batch call's
PG_EXTRA_CONF="gemma4.max_requests = 256
max_worker_processes = 16"
# shellcheck source=test/gpu/pg-server.sh
source "$(dirname "$0")/pg-server.sh"
psqlc -c "SELECT backend, device, kv_cache_dtype, max_num_seqs FROM gemma_stats"
PSQL=psqlc ROWS=${ROWS:-10000} DOC_WORDS=${DOC_WORDS:-350} PREFIX_WORDS=${PREFIX_WORDS:-700} \
  MAX_TOKENS=${MAX_TOKENS:-64} source "$(dirname "$0")/../bench/bench_jobs.sh" | tee "$out/pg-jobs.txt"
