# pg_gemma4 — build of the engine library, tools, tests and (with PGXS) the
# PostgreSQL extension `gemma4`.
#
#   make                 engine + tools (+ extension when pg_config is found)
#   make CUDA=0          never build the CUDA backend
#   make check-engine    engine tests, no PostgreSQL and no GPU needed
#   make install         extension, engine library and tools (PGXS paths)
#   make test            every suite: engine, SQL, concurrency, faults
#                        (test/run-all.sh, against a private copy of the
#                        server in build/pg: no root needed)
#   make pg-private      that private server with the extension installed
#   make install-default-model   the default model (Gemma 3 270M) for a
#                        system installation

# the default goal, whatever the included files define first
all:

include mk/engine.mk

PG_CONFIG ?= pg_config
HAVE_PG := $(shell command -v $(PG_CONFIG) >/dev/null 2>&1 && $(PG_CONFIG) --pgxs >/dev/null 2>&1 && echo yes)

ifeq ($(HAVE_PG)$(if $(wildcard src/pg/*.c),yes),yesyes)
MODULE_big = gemma4
OBJS = $(patsubst %.c,%.o,$(wildcard src/pg/*.c))
EXTENSION = gemma4
DATA = $(wildcard sql/gemma4--*.sql)
PG_CPPFLAGS = -Isrc/engine -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror
SHLIB_LINK = -ldl -lpthread
# The module never links the engine: the worker's engine process loads
# libgemma4engine with dlopen after it forks, so no backend maps it.
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
# PGXS tracks no header dependencies: every object (and its JIT bitcode)
# shares the shared-memory and wire layouts of these headers.
$(OBJS) $(OBJS:.o=.bc): src/pg/gemma4.h src/engine/engine.h

all: engine
install: install-engine
include mk/pg.mk

# The SQL, concurrency and fault suites against the installed extension, on
# throwaway instances (run as an unprivileged user).
.PHONY: installcheck
installcheck:
	test/pg/run-pg-tests.sh
else
all: engine
install:
	@echo "pg_config not found: install PostgreSQL's server development files to build the extension" >&2; exit 1
endif

.PHONY: test
test: all
	test/run-all.sh
