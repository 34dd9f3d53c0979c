-- Admin views: shape, privileges, and what they show while a request runs.

SELECT kv_group, layers, block_tokens, blocks_total > 0 AS has_blocks, blocks_used, blocks_free = blocks_total AS all_free,
       bytes > 0 AS has_bytes, bytes_used, sequences_live, full_window_fits > 0 AS fits
FROM gemma_kv_pool ORDER BY kv_group;

-- where the memory went: one row per use, adding up to gemma_stats' figures
SELECT use, bytes > 0 AS has_bytes FROM gemma_memory;
SELECT (SELECT sum(bytes) FROM gemma_memory WHERE use LIKE '%weights') = weight_bytes AS weights_add_up,
       (SELECT sum(bytes) FROM gemma_memory WHERE use LIKE 'KV pool%') = kv_bytes AS pool_adds_up,
       (SELECT sum(bytes) FROM gemma_memory WHERE use NOT LIKE '%weights' AND use NOT LIKE 'KV %') = workspace_bytes
         AS workspace_adds_up,
       (SELECT count(DISTINCT device) FROM gemma_memory) = 1 AS one_device
FROM gemma_stats;

SELECT attname, format_type(atttypid, atttypmod)
FROM pg_attribute WHERE attrelid = 'gemma_requests'::regclass AND attnum > 0 ORDER BY attnum;
SELECT attname, format_type(atttypid, atttypmod)
FROM pg_attribute WHERE attrelid = 'gemma_memory'::regclass AND attnum > 0 ORDER BY attnum;
SELECT attname, format_type(atttypid, atttypmod)
FROM pg_attribute WHERE attrelid = 'gemma_kv_pool'::regclass AND attnum > 0 ORDER BY attnum;
SELECT attname, format_type(atttypid, atttypmod)
FROM pg_attribute WHERE attrelid = 'gemma_stats'::regclass AND attnum > 0 ORDER BY attnum;

-- function properties
SELECT proname, provolatile, proparallel, proisstrict, proretset
FROM pg_proc WHERE proname LIKE 'gemma\_%' ORDER BY proname, pronargs;

-- a request in flight shows up, joinable to pg_stat_activity
BEGIN;
DECLARE c CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 2000);
FETCH 1 FROM c;
SELECT pg_sleep(0.3);
SELECT r.kind, r.state, r.prompt_tokens > 0 AS has_prompt, r.generated_tokens > 0 AS generating,
       r.kv_blocks > 0 AS holds_blocks, r.submitted_at <= now() + interval '1 s' AS submitted,
       r.time_to_first_token IS NOT NULL AS has_ttft, a.backend_type
FROM gemma_requests r JOIN pg_stat_activity a USING (pid);
SELECT sum(blocks_used) > 0 AS pool_in_use, max(sequences_live) AS live FROM gemma_kv_pool;
CLOSE c;
COMMIT;
SELECT g4_wait_idle();

-- prefix caching: a prompt starting like an earlier one finds its blocks
-- cached; both layer groups count the lookup and the hit
SHOW gemma4.enable_prefix_caching;
SELECT coalesce(sum(prefix_hits), 0) AS hits_before FROM gemma_kv_pool \gset
SELECT gemma_generate(repeat('The quick brown fox jumps over the lazy dog. ', 8) || 'One.', max_tokens => 2) IS NOT NULL AS first;
SELECT gemma_generate(repeat('The quick brown fox jumps over the lazy dog. ', 8) || 'Two.', max_tokens => 2) IS NOT NULL AS second;
SELECT kv_group, blocks_cached > 0 AS has_cached, blocks_used, prefix_lookups > 0 AS looked_up,
       prefix_hits > 0 AS hit, prefix_hit_rate > 0 AND prefix_hit_rate <= 1 AS rate_in_range
FROM gemma_kv_pool ORDER BY kv_group;
SELECT sum(prefix_hits) > :hits_before AS second_hit FROM gemma_kv_pool;
SELECT tokens_in_cached > 0 AS prefill_saved FROM gemma_stats;

-- privileges: the views are for pg_monitor, the functions for everyone
CREATE ROLE regress_g4_plain;
CREATE ROLE regress_g4_monitor IN ROLE pg_monitor;
SET ROLE regress_g4_plain;
SELECT * FROM gemma_stats;
SELECT * FROM gemma_kv_pool;
SELECT * FROM gemma_memory;
SELECT * FROM gemma_requests;
SELECT * FROM gemma_stats();
SELECT gemma_generate('Hello world', max_tokens => 4) IS NOT NULL AS can_generate;
SET ROLE regress_g4_monitor;
SELECT worker_state FROM gemma_stats;
SELECT count(*) AS pool_groups FROM gemma_kv_pool;
SELECT count(*) > 0 AS memory_uses FROM gemma_memory;
SELECT count(*) AS requests FROM gemma_requests;
RESET ROLE;
DROP ROLE regress_g4_plain;
DROP ROLE regress_g4_monitor;
