#!/usr/bin/awk -f
# crossover-table.awk — the table of run-gpu.sh's crossover stage, from its
# log: blocks "-- batch B accepted A" (A = - for plain decode) each followed
# by gemma4-run's "decode:" line and, with drafting, its "assistant:" line.
#
# One row per batch: plain decode tokens/s, then per forced acceptance a the
# rate and its ratio to plain; the assistant's milliseconds per draft pass at
# a = 3; last, per a, the largest batch at which drafting still gains (the
# figure for G4_SPEC_MAX_BATCH_DEFAULT).
/^-- batch / { b = $3; a = $5; if (!(b in seen)) { seen[b] = 1; order[nb++] = b } next }
/^decode:/ {
	for (i = 1; i <= NF; i++) if ($i == "tokens/s") rate[b, a] = $(i - 1) + 0
	next
}
/^assistant:/ {
	for (i = 1; i <= NF; i++) if ($i == "ms" && $(i + 1) == "per" && $(i + 2) ~ /^pass/) pass_ms[b, a] = $(i - 1)
	next
}
END {
	na = split("1 2 3", as, " ")
	printf "| batch | plain tok/s |"
	for (j = 1; j <= na; j++) printf " a = %s |", as[j]
	printf " draft pass (a = 3) |\n|---|---|"
	for (j = 1; j <= na; j++) printf "---|"
	printf "---|\n"
	for (k = 0; k < nb; k++) {
		b = order[k]
		p = rate[b, "-"]
		printf "| %s | %s |", b, ((b, "-") in rate) ? sprintf("%.1f", p) : "—"
		for (j = 1; j <= na; j++) {
			a = as[j]
			if (!((b, a) in rate)) { printf " — |"; continue }
			r = rate[b, a]
			if (p > 0) {
				printf " %.1f (%.2fx) |", r, r / p
				measured[a] = 1
				if (r > p) gains[a] = b
			} else
				printf " %.1f |", r
		}
		printf " %s |\n", ((b, "3") in pass_ms) ? pass_ms[b, "3"] " ms" : "—"
	}
	printf "\n"
	for (j = 1; j <= na; j++) {
		a = as[j]
		if (!(a in measured))
			printf "a = %s: not measured\n", a
		else if (a in gains)
			printf "a = %s: the largest batch at which drafting gains: %s\n", a, gains[a]
		else
			printf "a = %s: drafting loses at every batch\n", a
	}
}
