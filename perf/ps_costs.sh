#!/usr/bin/env bash
# The constants of the scattered-pull cost model (src/ps/scatter_plan.h,
# PullCosts) from ps-shapes tables: any number of rounds of
# `ps-shapes --role=worker` output, one transport, in FILEs (lines of other
# text are ignored, so a VM run's console log will do). Medians over the
# rounds of each shape's p50, then:
#   T1 = scatter_4096x64 / 4096   4096 sparse ids, row by row: one READ of a
#                                 272-byte inline block each -> op + 272 bytes
#   T2 = pull_4m                  17 READs (16 x 256 KiB of rows + headers)
#                                 of 4 MiB + 4 KiB
#   c_byte   = (T2 - 17 T1) / (4198400 - 17 * 272)
#   c_op     = T1 - 272 c_byte
#   c_gather = (scatter_1m_x1 - pull_1m_x1) / 1e6   (the span read is the
#              range pull of the same 1M rows; the rest is the gather)
# and the crossover: the span pays when the bytes of span per run of wanted
# ids are under c_op / c_byte.
#   perf/ps_costs.sh FILE...
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: perf/ps_costs.sh FILE... (ps-shapes worker tables)" >&2; exit 2; }
exec /usr/bin/python3 - "$@" <<'PY'
import statistics, sys
rows = {}
for path in sys.argv[1:]:
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) != 8 or f[0] == "shape":
            continue
        try:
            v = float(f[4])
        except ValueError:
            continue
        rows.setdefault(f[0], []).append(v)
need = ["scatter_4096x64", "pull_4m", "scatter_1m_x1", "pull_1m_x1"]
missing = [k for k in need if k not in rows]
if missing:
    sys.exit("ps_costs.sh: no rows for " + ", ".join(missing) + " in " + " ".join(sys.argv[1:]))
p50 = {k: statistics.median(v) for k, v in rows.items()}
t1 = p50["scatter_4096x64"] / 4096
t2 = p50["pull_4m"]
c_byte = max((t2 - 17 * t1) / (4198400 - 17 * 272), 1e-7)
c_op = t1 - 272 * c_byte
c_gather = max((p50["scatter_1m_x1"] - p50["pull_1m_x1"]) / 1e6, 0.0)
n = min(len(rows[k]) for k in need)
print(f"cost model constants from {n} round(s): c_op = {c_op:.3f} us, "
      f"c_byte = {c_byte * 1e3:.4f} ns ({1 / c_byte / 1e3:.2f} GB/s), "
      f"c_gather = {c_gather * 1e3:.1f} ns per row; crossover: the span pays below "
      f"{c_op / c_byte:.0f} bytes of span per run of wanted ids")
print(f"  (p50s: scatter_4096x64 {p50['scatter_4096x64']:.0f} us, pull_4m {t2:.0f} us, "
      f"scatter_1m_x1 {p50['scatter_1m_x1']:.0f} us, pull_1m_x1 {p50['pull_1m_x1']:.0f} us)")
PY
