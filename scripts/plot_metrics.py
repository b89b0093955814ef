#!/usr/bin/python3
"""Turns a run folder's metrics.jsonl into PNG curves.

    scripts/plot_metrics.py RUN_DIR [--out DIR]

Each line of RUN_DIR/metrics.jsonl is a JSON object with a "step", an optional "kind" ("train",
"validation") and numeric metrics. Metrics named "<group>/<name>" share one figure per group
(loss/mlm, loss/tlm, ... -> loss.png); other metrics get a figure each (lr.png, grad_norm.png).
Each kind is its own series, so validation losses and accuracies lie on the training curves'
figures; the retrieval probe's accuracy@1 (per pair and direction, and the mean) is retrieval.png. The PNG paths are printed, one per line. Uses Debian's
python3-matplotlib (scripts/setup.sh installs it).
"""
import argparse
import collections
import json
import math
import os
import sys


def read_metrics(path):
    """Returns {figure: {series label: [(step, value), ...]}}."""
    figures = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not a JSON object ({e.msg}); was the run killed "
                         f"mid-line? delete that line and re-run")
            if not isinstance(record, dict) or "step" not in record:
                sys.exit(f"{path}:{number}: expected a JSON object with a \"step\"")
            kind = record.get("kind", "train")
            for key, value in record.items():
                if key in ("step", "kind", "probe_layer") or isinstance(value, (str, bool)):
                    continue
                if value is None or (isinstance(value, float) and not math.isfinite(value)):
                    continue
                figure, _, name = key.partition("/")
                label = f"{name} ({kind})" if name else kind
                figures[figure][label].append((record["step"], value))
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="run folder holding metrics.jsonl")
    parser.add_argument("--out", help="folder for the PNG files (default: RUN_DIR/plots)")
    args = parser.parse_args()
    metrics = os.path.join(args.run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics):
        sys.exit(f"{metrics} not found: pass the run folder of an xlme-pretrain run (run.out_dir)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("matplotlib is missing: install python3-matplotlib (scripts/setup.sh does) and "
                 "run this script with /usr/bin/python3")
    figures = read_metrics(metrics)
    if not figures:
        sys.exit(f"{metrics} holds no numeric metrics yet")
    out = args.out or os.path.join(args.run_dir, "plots")
    os.makedirs(out, exist_ok=True)
    for figure, series in sorted(figures.items()):
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, points in sorted(series.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label,
                    marker="o" if len(points) < 20 else None)
        ax.set_xlabel("step")
        ax.set_title(figure)
        ax.grid(alpha=0.3)
        if len(series) > 1 or next(iter(series)) != "train":
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out, f"{figure}.png")
        tmp = path + ".tmp.png"
        fig.savefig(tmp, dpi=100)
        plt.close(fig)
        os.replace(tmp, path)  # a reader never sees a half-written image
        print(path)


if __name__ == "__main__":
    main()
