#!/usr/bin/python3
"""BSP vs SSP vs ASP on Fashion-MNIST, without and with one straggler.

Runs rdmaps-train with the same model, data, seed and learning rate under
BSP, SSP (s = 1, 3, 8) and ASP, first with every worker at full speed, then
with one worker slowed down --slow_factor times, and reports per run: time
to reach --target accuracy (on worker 0's accuracy curve, measured on the
first 2000 test samples every --eval_every steps, evaluation time excluded),
final test accuracy (full test set, after every worker finished), the job's
wall time (the slowest worker's), observed staleness (mean and max over
workers) and blocked time (mean per worker).

Writes OUT/runs.csv (one row per run), OUT/curves.csv (accuracy against
training time), OUT/consistency.gp and, with gnuplot installed
(apt-get install gnuplot-nox), OUT/consistency.png.

    perf/consistency-study/run.py --build build --out perf/consistency-study/results
    perf/consistency-study/run.py --out perf/consistency-study/results --summarize_only

--launcher=inproc (default) runs servers and workers as threads of one
rdmaps-train process over tcp on loopback (each worker has its own Client
and connections); --launcher=local runs them as processes under rdmaps-local.
Nothing here is a pass/fail test: it measures, and the numbers go to
docs/training.md.
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time

MODES = [("bsp", "bsp"), ("ssp1", "1"), ("ssp3", "3"), ("ssp8", "8"), ("asp", "asp")]


def run_one(args, staleness, straggler, repeat):
    train = os.path.join(args.build, "tools/train/rdmaps-train")
    flags = [
        "--model=" + args.model, "--hidden=" + args.hidden, "--epochs=%d" % args.epochs,
        "--batch_size=%d" % args.batch_size, "--staleness=" + staleness,
        "--seed=%d" % (args.seed + repeat), "--eval_every=%d" % args.eval_every,
        "--target_accuracy=%g" % args.target, "--output=json", "--progress=false",
        "--slow_mode=" + args.slow_mode, "--transport=tcp",
    ]
    if args.lr:
        flags.append("--lr=%g" % args.lr)
    if args.train_limit:
        flags.append("--train_limit=%d" % args.train_limit)
    if straggler:
        flags += ["--slow_worker=%d" % args.slow_worker, "--slow_factor=%d" % args.slow_factor]
    if args.launcher == "inproc":
        cmd = [train, "--inproc_servers=%d" % args.servers,
               "--inproc_workers=%d" % args.workers] + flags
    else:
        local = os.path.join(args.build, "tools/local/rdmaps-local")
        cmd = [local, "--servers", str(args.servers), "--workers", str(args.workers),
               "--transport=tcp", "--", train] + flags
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=args.run_timeout)
    elapsed = time.monotonic() - t0
    if p.returncode != 0:
        # Recorded as a failed run (and counted in the table), not hidden.
        sys.stderr.write(p.stderr[-3000:])
        sys.stderr.write("run failed (exit %d): %s\n" % (p.returncode, " ".join(cmd)))
        return None, elapsed
    reports = []
    for line in p.stdout.splitlines():
        brace = line.find("{")
        if brace >= 0:
            reports.append(json.loads(line[brace:]))
    if args.launcher == "inproc":
        workers = reports[0]["workers"]
    else:
        workers = sorted(reports, key=lambda r: r["worker"])
    return workers, elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="perf/consistency-study/results")
    ap.add_argument("--launcher", choices=["inproc", "local"], default="inproc")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--hidden", default="128")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0)
    ap.add_argument("--train_limit", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--eval_every", type=int, default=25)
    ap.add_argument("--slow_worker", type=int, default=3)
    ap.add_argument("--slow_factor", type=int, default=8)
    ap.add_argument("--slow_mode", choices=["wait", "compute"], default="wait")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--run_timeout", type=int, default=900)
    ap.add_argument("--modes", default=",".join(m for m, _ in MODES))
    ap.add_argument("--summarize_only", action="store_true",
                    help="only redraw the plot and table from OUT/runs.csv, OUT/curves.csv")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    wanted = args.modes.split(",")

    runs, curves, failed = [], [], []
    if args.summarize_only:
        # Re-draw the plot and the table from an earlier run's CSVs.
        def load(name, numeric):
            with open(os.path.join(args.out, name)) as f:
                rows = list(csv.DictReader(f))
            for r in rows:
                for k in numeric:
                    r[k] = float(r[k])
                r["repeat"] = int(r["repeat"])
            return rows
        runs = load("runs.csv", ["time_to_target_s", "final_accuracy", "job_wall_s",
                                 "staleness_mean", "staleness_max", "blocked_mean_s"])
        curves = load("curves.csv", ["seconds", "accuracy"])
        straggler_cases = ()
    else:
        straggler_cases = (False, True)
    for straggler in straggler_cases:
        for name, staleness in MODES:
            if name not in wanted:
                continue
            for repeat in range(args.repeats):
                workers, elapsed = run_one(args, staleness, straggler, repeat)
                if workers is None:
                    failed.append("%s straggler=%s repeat=%d" % (name, straggler, repeat))
                    continue
                w0 = workers[0]
                row = {
                    "mode": name,
                    "straggler": ("x%d" % args.slow_factor) if straggler else "none",
                    "repeat": repeat,
                    "time_to_target_s": round(w0["time_to_target_seconds"], 2),
                    "final_accuracy": round(w0["test_accuracy"], 4),
                    "job_wall_s": round(max(w["wall_seconds"] for w in workers), 2),
                    "worker0_wall_s": round(w0["wall_seconds"], 2),
                    "staleness_mean": round(sum(w["staleness_mean"] for w in workers) / len(workers), 2),
                    "staleness_max": max(w["staleness_max"] for w in workers),
                    "blocked_mean_s": round(sum(w["blocked_seconds"] for w in workers) / len(workers), 2),
                    "process_s": round(elapsed, 2),
                }
                runs.append(row)
                print(",".join(str(v) for v in row.values()), flush=True)
                for seconds, step, acc in w0["curve"]:
                    curves.append({"mode": name, "straggler": row["straggler"], "repeat": repeat,
                                   "seconds": round(seconds, 3), "step": step, "accuracy": acc})

    if not args.summarize_only:
        with open(os.path.join(args.out, "runs.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(runs[0].keys()))
            w.writeheader()
            w.writerows(runs)
        with open(os.path.join(args.out, "curves.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(curves[0].keys()))
            w.writeheader()
            w.writerows(curves)
    # One data file per (straggler, mode) for gnuplot (first repeat).
    plots = {"none": [], "x%d" % args.slow_factor: []}
    for straggler in plots:
        for name, _ in MODES:
            pts = [c for c in curves if c["mode"] == name and c["straggler"] == straggler
                   and c["repeat"] == 0]
            if not pts:
                continue
            path = os.path.join(args.out, "curve-%s-%s.dat" % (straggler, name))
            with open(path, "w") as f:
                for c in pts:
                    f.write("%s %s\n" % (c["seconds"], c["accuracy"]))
            plots[straggler].append((name, os.path.basename(path)))
    gp = os.path.join(args.out, "consistency.gp")
    with open(gp, "w") as f:
        f.write("set terminal png size 1200,480\n")
        f.write("set output 'consistency.png'\n")
        f.write("set multiplot layout 1,2\n")
        f.write("set xlabel 'training time (s)'\nset ylabel 'test accuracy (2000 samples)'\n")
        f.write("set yrange [0.7:0.9]\nset key bottom right\nset grid\n")
        f.write("set arrow from graph 0, first %g to graph 1, first %g nohead dt 2\n"
                % (args.target, args.target))
        for straggler, series in plots.items():
            title = ("no straggler" if straggler == "none"
                     else "worker %d %d x slower (%s)" % (args.slow_worker, args.slow_factor,
                                                         args.slow_mode))
            f.write("set title '%s: %s, %d servers, %d workers'\n"
                    % (title, args.model, args.servers, args.workers))
            f.write("plot " + ", ".join("'%s' using 1:2 with linespoints title '%s'" % (d, n)
                                        for n, d in series) + "\n")
        f.write("unset multiplot\n")
    # Medians over repeats, as a markdown table (for docs/training.md).
    def median(xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2

    lines = ["| straggler | mode | runs | time to %.0f %% (s) | final accuracy | job time (s) "
             "| staleness mean / max | blocked per worker (s) |" % (100 * args.target),
             "|---|---|---|---|---|---|---|---|"]
    for straggler in ("none", "x%d" % args.slow_factor):
        for name, _ in MODES:
            rs = [r for r in runs if r["mode"] == name and r["straggler"] == straggler]
            if not rs:
                continue
            reached = [r["time_to_target_s"] for r in rs if r["time_to_target_s"] >= 0]
            ttt = ("%.2f" % median(reached)) if reached else "never"
            if reached and len(reached) < len(rs):
                ttt += " (%d of %d)" % (len(reached), len(rs))
            lines.append("| %s | %s | %d | %s | %.2f %% | %.1f | %.1f / %d | %.2f |" % (
                straggler, name, len(rs), ttt, 100 * median([r["final_accuracy"] for r in rs]),
                median([r["job_wall_s"] for r in rs]), median([r["staleness_mean"] for r in rs]),
                max(r["staleness_max"] for r in rs), median([r["blocked_mean_s"] for r in rs])))
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(table)
    print(table)
    if failed:
        print("FAILED runs (see stderr):", "; ".join(failed))
        with open(os.path.join(args.out, "failed.txt"), "w") as f:
            f.write("\n".join(failed) + "\n")
    if shutil.which("gnuplot"):
        subprocess.run(["gnuplot", "consistency.gp"], cwd=args.out, check=True)
        print("wrote", os.path.join(args.out, "consistency.png"))
    else:
        print("gnuplot not found (apt-get install gnuplot-nox); wrote", gp)


if __name__ == "__main__":
    main()
