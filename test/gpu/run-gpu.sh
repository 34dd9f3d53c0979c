#!/usr/bin/env bash
# run-gpu.sh — the CUDA backend's checks and benchmarks, on a GPU machine.
#
#   test/gpu/run-gpu.sh [parity] [bench] [hf] [sanitize] [engine] [prefix] [mtp] [crossover] [pg]
#                                              (default: parity bench hf)
#
# parity    every GPU operation against the CPU backend (build/run-gpu-tests:
#           the rows of parity_table.c, which G4_PARITY_LIST=1 lists without a
#           GPU; and the model tests)
# bench     per-operation, in-step (knockout) and per-step figures on the 12B
#           shape (bench-gpu)
# hf        transformers on the same 12B-shaped checkpoint, side by side
# sanitize  compute-sanitizer memcheck on one parity test
# engine    the whole engine (scheduler, step graphs, device sampling) through
#           gemma4-run: batch 1, 16 and 64 with 2k prompts
# prefix    the prefix cache through the engine (bench-prefix): 640 requests
#           sharing a 1,000-token prefix, 500 tokens of their own, batch 64
# mtp       speculative decoding on the 12B shape with a random 12B-shaped
#           assistant (/tmp/m12b-assistant) through gemma4-run: plain decode
#           and drafting with a = 0..4 drafts forced accepted at batch 1, and
#           plain, a = 0 and a = 3 at 16 and 64 (assistant time per draft
#           token, tokens/s per a; the verify step's cost is the a = 0 run's
#           step time less its drafting time)
# crossover where drafting stops paying: decode tokens/s through gemma4-run
#           (512-token prompts, 128 new tokens) without drafting and with
#           a = 1, 2, 3 of 4 drafts forced accepted, at batch 1, 16, 32, 64
#           and 128, as one table with each rate's ratio to plain decode and
#           the largest batch at which each a still gains: the figures that
#           set G4_SPEC_MAX_BATCH_DEFAULT (engine.h)
# pg        PostgreSQL end to end (test/gpu/pg-e2e.sh; needs build/device)
#
# Builds what a stage needs when it is missing or does not start here (sm_90a
# only, to keep the build short); G4_BIN names a directory of prebuilt
# binaries instead (e.g. build/dev, compiled elsewhere and carried).
# Generates the tiny fixture model and the random 12B-shaped model (/tmp/m12b,
# 7.6 GB, never carried) and prints a summary last.  Logs go to $OUT (or
# build/gpu-logs), one per stage.
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
LOGS=${OUT:-$ROOT/build/gpu-logs}
mkdir -p "$LOGS"
STAGES=${*:-parity bench hf}
M12B=${M12B:-/tmp/m12b}
TINY=$ROOT/build/models/tiny-gemma4
export NCCL_NVLS_ENABLE=0

has() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }
say() { echo "== $*"; }

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv,noheader 2>&1 | head -2

# cuBLASLt (linked shared): where the loader does not find it, the toolkit's
# or a Python wheel's copy
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so'; then
	LT=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.*' 2>/dev/null | head -1)
	[ -n "$LT" ] && export LD_LIBRARY_PATH=$(dirname "$LT")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

# build only what the stages need and is missing or cannot start here
BIN=${G4_BIN:-build}
need=$BIN/gemma4-make-model
if has parity || has sanitize; then need="$need $BIN/run-gpu-tests"; fi
if has bench; then need="$need $BIN/bench-gpu"; fi
if has engine || has mtp || has crossover; then need="$need $BIN/gemma4-run"; fi
if has prefix; then need="$need $BIN/bench-prefix"; fi
need_build=0
for b in $need; do
	if [ ! -x "$b" ]; then need_build=1; fi
done
if [ $need_build = 0 ] && [ -x "$BIN/run-gpu-tests" ] && ! "$BIN/run-gpu-tests" no-such-test >/dev/null 2>&1; then
	need_build=1
fi
if [ $need_build = 1 ]; then
	say "building (sm_90a) in $BIN"
	make -j16 BUILD="$BIN" NVCC_ARCH="-gencode arch=compute_90a,code=sm_90a" engine gpu-tests "$BIN/bench-prefix" \
		>"$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
fi

mkdir -p "$(dirname "$TINY")"
if [ ! -f "$TINY/config.json" ]; then
	"$BIN/gemma4-make-model" --preset tiny --out "$TINY" >/dev/null || exit 1
fi
# its MTP assistant (test_gpu_mtp.c)
if [ ! -f "$TINY-assistant/config.json" ]; then
	"$BIN/gemma4-make-model" --preset tiny --assistant --out "$TINY-assistant" >/dev/null || exit 1
fi

# the 12B-shaped model is written on the CPU while the parity tests run
GEN_PID=
if { has bench || has hf || has engine || has prefix || has mtp || has crossover || has pg; } &&
	[ ! -f "$M12B/config.json" ]; then
	say "generating the 12B-shaped model in $M12B (background)"
	( t0=$(date +%s); "$BIN/gemma4-make-model" --preset 12b --out "$M12B.tmp" >"$LOGS/make12b.log" 2>&1 &&
		mv "$M12B.tmp" "$M12B" && echo "generated in $(( $(date +%s) - t0 )) s" >>"$LOGS/make12b.log" ) &
	GEN_PID=$!
fi

if has parity; then
	say "parity (log: parity.log)"
	G4_TEST_SRCDIR=$ROOT G4_TEST_TMPDIR=$ROOT/build/test-tmp G4_FIXTURE_MODEL=$TINY \
		timeout 300 "$BIN/run-gpu-tests" gpu_ >"$LOGS/parity.log" 2>&1
	echo "exit $?" >>"$LOGS/parity.log"
fi

if [ -n "$GEN_PID" ]; then
	wait "$GEN_PID"
	cat "$LOGS/make12b.log"
	[ -f "$M12B/config.json" ] || exit 1
fi

if has bench; then
	say "bench-gpu (log: bench.log)"
	timeout 400 "$BIN/bench-gpu" --model "$M12B" ${BENCH_WHAT:+--what $BENCH_WHAT} >"$LOGS/bench.log" 2>&1
	echo "exit $?" >>"$LOGS/bench.log"
fi

if has hf; then
	say "transformers side-by-side (log: hf.log)"
	PYTHONUNBUFFERED=1 timeout 240 python3 test/bench/bench_hf.py "$M12B" >"$LOGS/hf.log" 2>&1
	echo "exit $?" >>"$LOGS/hf.log"
fi

if has sanitize; then
	say "compute-sanitizer memcheck on ${SANITIZE_FILTER:=gpu_parity_attention_exact} (log: sanitize.log)"
	G4_TEST_SRCDIR=$ROOT G4_TEST_TMPDIR=$ROOT/build/test-tmp G4_FIXTURE_MODEL=$TINY timeout 200 \
		compute-sanitizer --tool memcheck --print-limit 20 "$BIN/run-gpu-tests" "$SANITIZE_FILTER" >"$LOGS/sanitize.log" 2>&1
	echo "exit $?" >>"$LOGS/sanitize.log"
fi

if has engine; then
	say "engine through gemma4-run (log: engine.log)"
	: >"$LOGS/engine.log"
	for run in "1 256" "16 256" "64 128"; do
		set -- $run
		echo "-- batch $1, 2048-token prompts, $2 new tokens" >>"$LOGS/engine.log"
		timeout 200 "$BIN/gemma4-run" --model "$M12B" --backend cuda --bench --bench-prompt-tokens 2048 \
			--max-tokens "$2" --batch "$1" >>"$LOGS/engine.log" 2>&1
	done
	echo "exit $?" >>"$LOGS/engine.log"
fi

if has prefix; then
	say "prefix cache through the engine (log: prefix.log)"
	timeout 500 "$BIN/bench-prefix" --model "$M12B" --backend cuda --requests 640 --prefix 1000 --doc 500 \
		--max-tokens 16 --max-num-seqs 64 --max-batched 16384 --max-model-len 4096 >"$LOGS/prefix.log" 2>&1
	echo "exit $?" >>"$LOGS/prefix.log"
fi

# the random 12B-shaped assistant (mtp, crossover)
if { has mtp || has crossover; } && [ ! -f "$M12B-assistant/config.json" ]; then
	"$BIN/gemma4-make-model" --preset 12b --assistant --out "$M12B-assistant" >/dev/null || exit 1
fi

if has mtp; then
	say "speculative decoding through gemma4-run (log: mtp.log)"
	: >"$LOGS/mtp.log"
	for run in "1 -" "1 0" "1 1" "1 2" "1 3" "1 4" "16 -" "16 0" "16 3" "64 -" "64 0" "64 3"; do
		set -- $run
		echo "-- batch $1, 512-token prompts, 128 new tokens, accepted drafts forced: $2" >>"$LOGS/mtp.log"
		if [ "$2" = - ]; then spec=; else spec="--draft $M12B-assistant --bench-accept $2 --spec-max-batch 4096"; fi
		timeout 200 "$BIN/gemma4-run" --model "$M12B" --backend cuda --bench --bench-prompt-tokens 512 \
			--max-tokens 128 --batch "$1" $spec >>"$LOGS/mtp.log" 2>&1
	done
	echo "exit $?" >>"$LOGS/mtp.log"
fi

if has crossover; then
	say "where drafting stops paying (log: crossover.log, table: crossover.txt)"
	: >"$LOGS/crossover.log"
	for b in 1 16 32 64 128; do
		for a in - 1 2 3; do
			echo "-- batch $b accepted $a" >>"$LOGS/crossover.log"
			if [ "$a" = - ]; then spec=; else spec="--draft $M12B-assistant --bench-accept $a --spec-max-batch 4096"; fi
			timeout 200 "$BIN/gemma4-run" --model "$M12B" --backend cuda --bench --bench-prompt-tokens 512 \
				--max-tokens 128 --batch "$b" $spec 2>&1 | grep -E '^(decode|assistant):' >>"$LOGS/crossover.log"
		done
	done
	test/gpu/crossover-table.awk "$LOGS/crossover.log" >"$LOGS/crossover.txt"
fi

if has pg; then
	say "PostgreSQL end to end (log: pg.log)"
	G4_BIN=$BIN timeout 300 test/gpu/pg-e2e.sh "$LOGS/pg" 30 >"$LOGS/pg.log" 2>&1
	echo "exit $?" >>"$LOGS/pg.log"
fi

# ---- summary ----
echo
echo "================ summary ================"
if [ -f "$LOGS/parity.log" ] && has parity; then
	echo "-- parity: $(grep -c '^PARITY ' "$LOGS/parity.log") checks, $(grep '^PARITY ' "$LOGS/parity.log" | grep -c 'FAIL$') failed; $(tail -2 "$LOGS/parity.log" | tr '\n' ' ')"
	grep '^PARITY ' "$LOGS/parity.log" | grep 'FAIL$' | head -40
	grep -E '^(FAIL|skip) ' "$LOGS/parity.log" | head -20
	# the worst figure of each operation
	grep '^PARITY ' "$LOGS/parity.log" | awk -F'|' '{ gsub(/^PARITY +| +$/, "", $1); v=$3+0;
		if (!($1 in w) || v/($4+1e-30) > r[$1]) { w[$1]=$0; r[$1]=v/($4+1e-30) } } END { for (k in w) print w[k] }' | sort
fi
if has sanitize && [ -f "$LOGS/sanitize.log" ]; then
	echo "-- sanitize: $(grep -E 'ERROR SUMMARY|exit' "$LOGS/sanitize.log" | tr '\n' ' ')"
fi
if has bench && [ -f "$LOGS/bench.log" ]; then
	echo "-- bench"
	grep -E '^BENCH setup' "$LOGS/bench.log"
	sed -n '/== bench-gpu summary/,$p' "$LOGS/bench.log"
	grep -E 'error|failed|bench-gpu:' "$LOGS/bench.log" | head -5
	tail -1 "$LOGS/bench.log"
fi
if has mtp && [ -f "$LOGS/mtp.log" ]; then
	echo "-- mtp"
	grep -E '^(--|decode:|drafts:|assistant:)' "$LOGS/mtp.log"
	tail -1 "$LOGS/mtp.log"
fi
if has crossover && [ -f "$LOGS/crossover.txt" ]; then
	echo "-- crossover"
	cat "$LOGS/crossover.txt"
fi
if has hf && [ -f "$LOGS/hf.log" ]; then
	echo "-- transformers"
	grep -E '^HF |Error|exit' "$LOGS/hf.log" | tail -12
fi
if has engine && [ -f "$LOGS/engine.log" ]; then
	echo "-- engine"
	grep -E '^(-- batch|model|prefill|decode|memory|exit)' "$LOGS/engine.log"
fi
if has prefix && [ -f "$LOGS/prefix.log" ]; then
	echo "-- prefix"
	grep -vE '^(model|loading)' "$LOGS/prefix.log" | tail -8
fi
if has pg && [ -f "$LOGS/pg.log" ]; then
	echo "-- PostgreSQL"
	tail -12 "$LOGS/pg.log"
fi
