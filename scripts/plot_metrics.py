#!/usr/bin/env python3
"""Turns a run folder's metrics.jsonl into PNG curves a person reads at a glance.

    scripts/plot_metrics.py RUN_DIR [--out DIR] [--describe]

Each line of RUN_DIR/metrics.jsonl is a JSON object with a "step", an optional "kind" ("train",
"validation") and numeric metrics, as xlme-pretrain writes them. The panels, each on its own scale:
  generator: the generator's (MLM/TLM) loss and accuracy per task, with the held-out unigram
    floor (always predicting the most frequent masked piece) beside the accuracy
  discriminator: the discriminator's (MRTD/TRTD) loss and replaced-token F1 per task
  retrieval: the held-out pairs' accuracy@1, the mean bold and each pair and direction faint
  optimization: learning rate and gradient norm (two y axes), and the total loss
  throughput: tokens per second and peak memory (two y axes), and MFU where measured
A task's training curve is a thin line, its validation points are circles on a dashed line of the
same colour. summary.png holds every panel; generator.png, discriminator.png, retrieval.png,
optimization.png and throughput.png hold one row each. The PNG paths are printed, one per line,
summary.png first; --describe also prints each panel's title, y-axis labels and legend. A term is
the discriminator's when its name ends in "rtd" (mrtd, trtd) or it records an F1, the generator's
otherwise. Records of any kind but "train" are validation.
Uses Debian's python3-matplotlib (scripts/setup.sh installs it).
"""
import argparse
import collections
import json
import math
import os
import sys

def read_metrics(path):
    """Returns {metric: {kind: [(step, value), ...] sorted by step}}."""
    metrics = collections.defaultdict(lambda: collections.defaultdict(list))
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
            kind = "train" if record.get("kind", "train") == "train" else "validation"
            for key, value in record.items():
                if key in ("step", "kind") or isinstance(value, (str, bool)) or value is None:
                    continue
                if isinstance(value, float) and not math.isfinite(value):
                    continue
                metrics[key][kind].append((record["step"], value))
    for series in metrics.values():
        for points in series.values():
            points.sort()
    return metrics


class Panel:
    """One axes' worth of curves; `draw` fills a matplotlib axes and returns its description."""

    def __init__(self, title, ylabel, from_zero=False):
        self.title, self.ylabel, self.from_zero = title, ylabel, from_zero
        self.curves = []  # (points, style dict, legend label or None)
        self.right = None  # (ylabel, [(points, style, label)]) on a second y axis

    def empty(self):
        return not self.curves and not (self.right and self.right[1])

    def draw(self, ax):
        handles = []
        for points, style, label in self.curves:
            (line,) = ax.plot(*zip(*points), label=label, **style)
            if label:
                handles.append(line)
        ax.set_title(self.title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(self.ylabel, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if self.right and self.right[1]:
            twin = ax.twinx()
            for points, style, label in self.right[1]:
                (line,) = twin.plot(*zip(*points), label=label, **style)
                handles.append(line)
            twin.set_ylabel(self.right[0], fontsize=8)
            twin.tick_params(labelsize=8)
            if self.from_zero:
                twin.set_ylim(bottom=0)
        if self.from_zero:
            ax.set_ylim(bottom=0)
        if handles:
            ax.legend(handles=handles, labels=[h.get_label() for h in handles], fontsize=7,
                      loc="best", framealpha=0.8)
        right = f"; right axis {self.right[0]}" if self.right and self.right[1] else ""
        return f"{self.title} ({self.ylabel}{right}): " + ", ".join(h.get_label() for h in handles)


COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


def per_task_panel(title, ylabel, metrics, prefix, tasks):
    """Each task's training curve (thin) and validation points (circles, dashed), one colour each."""
    panel = Panel(title, ylabel)
    for i, task in enumerate(tasks):
        colour = COLOURS[i % len(COLOURS)]
        series = metrics.get(f"{prefix}/{task}", {})
        if series.get("train"):
            few = len(series["train"]) < 20  # a marker per point while the line is short
            panel.curves.append((series["train"], dict(color=colour, linewidth=1.0, alpha=0.8,
                                                       marker="." if few else None),
                                 f"{task} train"))
        if series.get("validation"):
            panel.curves.append((series["validation"],
                                 dict(color=colour, linestyle="--", marker="o", markersize=4,
                                      linewidth=1.2), f"{task} validation"))
    return panel


def retrieval_panel(metrics):
    """The mean bold, each direction's mean dashed, every pair and direction faint (one entry)."""
    panel = Panel("retrieval on held-out pairs (validation)", "accuracy@1")
    pairs = sorted(k for k in metrics if k.startswith("retrieval/") and k.count("/") == 2)
    for n, key in enumerate(pairs):
        points = metrics[key].get("validation") or metrics[key].get("train")
        panel.curves.append((points, dict(color="grey", linewidth=0.8, alpha=0.35, marker=".",
                                          markersize=3),
                             f"each pair and direction ({len(pairs)})" if n == 0 else None))
    for key, label, style in (
            ("retrieval/a_to_b", "mean a->b", dict(color="tab:blue", linestyle="--", linewidth=1.2)),
            ("retrieval/b_to_a", "mean b->a", dict(color="tab:orange", linestyle="--", linewidth=1.2)),
            ("retrieval/mean", "mean", dict(color="black", linewidth=2.2, marker="o",
                                            markersize=4))):
        points = metrics.get(key, {}).get("validation") or metrics.get(key, {}).get("train")
        if points:
            panel.curves.append((points, style, label))
    return panel


def train_points(metrics, key):
    return metrics.get(key, {}).get("train", [])


def panel_rows(metrics):
    """[(file stem, [Panel, ...])], the rows of summary.png; empty panels left out."""
    terms = sorted({k.split("/", 1)[1] for k in metrics if k.startswith("loss/")})
    discriminator = [t for t in terms if t.endswith("rtd") or f"f1/{t}" in metrics]
    generator = [t for t in terms if t not in discriminator]
    accuracy = per_task_panel("generator accuracy", "accuracy", metrics, "accuracy", generator)
    for i, task in enumerate(generator):
        floor = metrics.get(f"unigram_accuracy/{task}", {}).get("validation")
        if floor:  # always predicting the held-out set's most frequent masked piece
            accuracy.curves.append((floor, dict(color=COLOURS[i % len(COLOURS)], linestyle=":",
                                                linewidth=1.2), f"{task} unigram floor"))
    rows = [
        ("generator", [per_task_panel("generator loss", "cross-entropy", metrics, "loss", generator),
                       accuracy]),
        ("discriminator", [
            per_task_panel("discriminator loss", "binary cross-entropy", metrics, "loss",
                           discriminator),
            per_task_panel("discriminator replaced-token F1", "F1", metrics, "f1",
                           discriminator)]),
        ("retrieval", [retrieval_panel(metrics)]),
    ]
    schedule = Panel("learning rate and gradient norm", "learning rate")
    if train_points(metrics, "lr"):
        schedule.curves.append((train_points(metrics, "lr"), dict(color="tab:blue"),
                                "learning rate"))
    schedule.right = ("gradient norm", [])
    if train_points(metrics, "grad_norm"):
        schedule.right[1].append((train_points(metrics, "grad_norm"),
                                  dict(color="tab:red", linewidth=0.8, alpha=0.7),
                                  "gradient norm (right)"))
    total = Panel("total loss (generator + weighted discriminator)", "loss")
    if train_points(metrics, "total_loss"):
        total.curves.append((train_points(metrics, "total_loss"), dict(color="black",
                                                                       linewidth=1.0), "train"))
    rows.append(("optimization", [schedule, total]))
    speed = Panel("throughput and memory", "tokens / s", from_zero=True)
    if train_points(metrics, "tokens_per_s"):
        speed.curves.append((train_points(metrics, "tokens_per_s"),
                             dict(color="tab:green", linewidth=1.0), "tokens / s"))
    speed.right = ("peak memory (MiB)", [])
    if train_points(metrics, "peak_memory_mib"):
        speed.right[1].append((train_points(metrics, "peak_memory_mib"),
                               dict(color="tab:purple", linewidth=1.2), "peak memory (right)"))
    mfu = Panel("model FLOPs utilization", "MFU", from_zero=True)
    if train_points(metrics, "mfu"):
        mfu.curves.append((train_points(metrics, "mfu"), dict(color="tab:green"), "MFU"))
    rows.append(("throughput", [speed, mfu]))
    return [(stem, [p for p in panels if not p.empty()]) for stem, panels in rows
            if any(not p.empty() for p in panels)]


def save(fig, path, plt):
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)  # a reader never sees a half-written image


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="run folder holding metrics.jsonl")
    parser.add_argument("--out", help="folder for the PNG files (default: RUN_DIR/plots)")
    parser.add_argument("--describe", action="store_true",
                        help="also print each panel's title, axis labels and legend")
    args = parser.parse_args()
    metrics_path = os.path.join(args.run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics_path):
        sys.exit(f"{metrics_path} not found: pass the run folder of an xlme-pretrain run "
                 f"(run.out_dir)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("matplotlib is missing: run this script with the project's .venv/bin/python3 "
                 "(scripts/setup.sh installs requirements.txt into it)")
    metrics = read_metrics(metrics_path)
    rows = panel_rows(metrics)
    if not rows:
        sys.exit(f"{metrics_path} holds no metrics this script draws yet")
    out = args.out or os.path.join(args.run_dir, "plots")
    os.makedirs(out, exist_ok=True)

    columns = max(len(panels) for _, panels in rows)
    fig, axes = plt.subplots(len(rows), columns, figsize=(6.5 * columns, 3.6 * len(rows)),
                             squeeze=False)
    descriptions = []
    for r, (_, panels) in enumerate(rows):
        for c in range(columns):
            if c < len(panels):
                descriptions.append(panels[c].draw(axes[r][c]))
            else:
                axes[r][c].axis("off")
    fig.suptitle(os.path.abspath(args.run_dir), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.6 * len(rows))))
    summary = os.path.join(out, "summary.png")
    save(fig, summary, plt)
    print(summary)
    if args.describe:
        for d in descriptions:
            print(f"  {d}")
    for stem, panels in rows:
        fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 3.8), squeeze=False)
        for c, panel in enumerate(panels):
            panel.draw(axes[0][c])
        fig.tight_layout()
        path = os.path.join(out, f"{stem}.png")
        save(fig, path, plt)
        print(path)


if __name__ == "__main__":
    main()
