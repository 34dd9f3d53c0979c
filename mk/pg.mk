# mk/pg.mk — installations of the extension beyond `make install`
# (included from the Makefile after PGXS, whose directory variables it uses).

# A private PostgreSQL tree (a copy of this machine's server) with the
# extension installed: tests and the demo run against it without root and
# without touching the system installation.
PG_PRIVATE := $(BUILD)/pg
.PHONY: pg-private install-default-model
pg-private: all
	@tools/private-pg.sh $(PG_PRIVATE) >/dev/null
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(PG_PRIVATE) >/dev/null
	@echo "private PostgreSQL with gemma4: $(PG_PRIVATE)$(bindir)"

# The embedded default model, where the worker looks when gemma4.model_dir
# is empty: <sharedir>/gemma4/default-model.gguf
install-default-model: fetch-default-model
	$(MKDIR_P) '$(DESTDIR)$(datadir)/gemma4'
	$(INSTALL_DATA) $(DEFAULT_MODEL) '$(DESTDIR)$(datadir)/gemma4/default-model.gguf'
