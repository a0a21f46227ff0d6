#!/usr/bin/python3
"""How well any time model could rank vTrain's measured multi-node runs, given their noise.

vTrain's ground truth (planner/data/vtrain_ground_truth_multi.csv) holds one measurement per
layout. Its time is not smooth in the micro-batch size within a layout (39.1B, tp 4 x dp 16 x
pp 8: 16.1, 17.6, 17.4, 16.1 and 20.6 s at micro-batches 2, 3, 4, 6 and 12), so part of each time
is noise that no model of the hardware predicts. This script estimates that noise and what it
costs a rank correlation:

1. noise: within every layout (tp, dp, pp) measured at 4 or more micro-batch sizes, a least-squares
   fit of log time to a quadratic in log micro-batch; the residuals' standard deviation (with the
   fit's degrees of freedom taken out) estimates the noise of one measurement, as a fraction. The
   quadratic's own misfit counts as noise too, so this is an upper estimate.
2. ceiling: for each model, a perfect model of the measured times, compared with the same times
   measured again with that noise (log-normal, 2000 draws): the median Spearman rank correlation
   and its 10-90% range. A model that ranks these runs better than that is fitting their noise.

Run: /usr/bin/python3 benchmarks/vtrain_noise_ceiling.py [--csv PATH] [--noise 0.03 0.05 ...]
"""
import argparse
import collections
import csv
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def spearman(a, b):
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return np.corrcoef(ra, rb)[0, 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=os.path.join(HERE, "..", "planner", "data",
                                                  "vtrain_ground_truth_multi.csv"))
    ap.add_argument("--noise", type=float, nargs="*", default=[0.03],
                    help="noise levels to try beside the estimated one (fractions)")
    ap.add_argument("--draws", type=int, default=2000)
    a = ap.parse_args()

    by_model = collections.defaultdict(list)
    for r in csv.DictReader(open(a.csv)):
        by_model[float(r["Parameters (billion)"])].append(r)

    residuals, dof = [], 0
    per_model = {}
    for model, runs in sorted(by_model.items()):
        before = (len(residuals), dof)
        layouts = collections.defaultdict(list)
        for r in runs:
            key = (r["tensor parallelism"], r["data parallelism"], r["pipeline parallelism"])
            layouts[key].append((float(r["micro batch"]), float(r["iteration time (ms)"])))
        for points in layouts.values():
            if len(points) < 4:
                continue
            x = np.log([p[0] for p in points])
            y = np.log([p[1] for p in points])
            basis = np.vstack([np.ones_like(x), x, x * x]).T
            coef, *_ = np.linalg.lstsq(basis, y, rcond=None)
            residuals.extend(y - basis @ coef)
            dof += len(points) - 3
        r, d = residuals[before[0]:], dof - before[1]
        if d > 0:
            per_model[model] = float(np.sqrt(np.sum(np.square(r)) / d))
            print("%gB: residual sd %.3f (%d runs, %d degrees of freedom)" % (
                model, per_model[model], len(r), d))
    sigma = float(np.sqrt(np.sum(np.square(residuals)) / dof))
    print("all models: residual sd of log time within layouts %.3f (%d runs in layouts of 4+ "
          "micro-batch sizes, %d degrees of freedom)" % (sigma, len(residuals), dof))

    rng = np.random.default_rng(0)
    print("\n| model | layouts | noise | a perfect model's rank correlation, median | 10%-90% |")
    print("|---|---:|---:|---:|---|")
    for model, runs in sorted(by_model.items()):
        t = np.array([float(r["iteration time (ms)"]) for r in runs])
        levels = a.noise + [round(sigma, 3)] + ([round(per_model[model], 3)]
                                                 if model in per_model else [])
        for s in sorted(set(levels)):
            c = [spearman(t, t * np.exp(rng.normal(0.0, s, len(t)))) for _ in range(a.draws)]
            print("| %gB | %d | %.3f | %.3f | %.3f-%.3f |" % (
                model, len(t), s, np.median(c), np.percentile(c, 10), np.percentile(c, 90)))


if __name__ == "__main__":
    main()
