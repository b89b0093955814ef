#!/usr/bin/env python3
"""The table and plot of scripts/ablation_cpu.sh: per objective set, means and spreads over seeds.

    scripts/ablation_table.py OUT --sets xlme xlme-mono mlm+tlm mlm --seeds 1 2 3

Reads OUT/<set>/seed<k>/{metrics.jsonl, retrieval/results.json, pos/results.json} and
OUT/untrained/{retrieval,pos}/results.json; writes OUT/table.md and OUT/ablation.png.
"""
import argparse
import json
import os
import statistics
import sys


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def retrieval_by_layer(path):
    """{layer index: mean accuracy@1 over the pairs} of an xlme-finetune retrieval results.json."""
    with open(path) as f:
        results = json.load(f)
    block = next(results[k] for k in ("trained", "untrained") if k in results)
    return {int(name.split()[1]): pairs["mean"]["accuracy"]
            for name, pairs in block["layers"].items()}


def coverage(average):
    """What a results.json average covers ("over 1 of 1 languages"; "" where not recorded)."""
    if "covers" not in average:
        return ""
    return f"over {len(average['covers'])} of {average['of']} languages"


def pos_values(path):
    """The test average (the task's main score, per fine-tuning seed) of a results.json, and the
    header of its column: the main score and what the average covers."""
    with open(path) as f:
        results = json.load(f)
    test = results["test"]
    label = ", ".join(x for x in (test["main"], coverage(test["average"]),
                                  "on subsets" if "subset" in test else "") if x)
    return test["average"]["values"], label


def spread(values):
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--sets", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", required=True)
    args = parser.parse_args()
    runs = {}
    for s in args.sets:
        for seed in args.seeds:
            run = os.path.join(args.out, s, f"seed{seed}")
            records = load_jsonl(os.path.join(run, "metrics.jsonl"))
            train = [r for r in records if r.get("kind", "train") == "train"]
            tokens_at = {r["step"]: r["tokens_seen"] for r in train}
            valid = [dict(r, tokens=tokens_at.get(r["step"], 0)) for r in records
                     if r.get("kind") == "validation"]
            runs[(s, seed)] = {
                "tokens": train[-1]["tokens_seen"],
                "flops": sum(r.get("flops", 0) for r in train),
                "valid": valid,
                "retrieval": retrieval_by_layer(os.path.join(run, "retrieval", "results.json")),
                "pos": pos_values(os.path.join(run, "pos", "results.json"))[0],
            }
    floor = os.path.join(args.out, "untrained")
    floor_retrieval = retrieval_by_layer(os.path.join(floor, "retrieval", "results.json"))
    floor_pos, pos_main = pos_values(os.path.join(floor, "pos", "results.json"))
    layers = sorted(floor_retrieval)

    lines = ["| objectives | seeds | tokens | training FLOPs | "
             + " | ".join(f"retrieval layer {layer}" for layer in layers)
             + f" | silver POS ({pos_main}) | MLM acc. | TLM acc. | MRTD F1 | TRTD F1 |",
             "|---|---:|---:|---:|" + "---:|" * (len(layers) + 5)]
    for s in args.sets:
        rs = [runs[(s, seed)] for seed in args.seeds]

        def last(key):
            return [r["valid"][-1][key] for r in rs if key in r["valid"][-1]]
        cells = [s, str(len(rs)), f"{rs[0]['tokens']:,}", f"{statistics.mean(r['flops'] for r in rs):.3g}"]
        cells += [spread([r["retrieval"][layer] for r in rs]) for layer in layers]
        cells += [spread([v for r in rs for v in r["pos"]])]
        cells += [spread(last(k)) for k in ("accuracy/mlm", "accuracy/tlm", "f1/mrtd", "f1/trtd")]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("| untrained | 1 | 0 | 0 | "
                 + " | ".join(f"{floor_retrieval[layer]:.2f}" for layer in layers)
                 + f" | {spread(floor_pos)} | | | | |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    color = {s: f"C{i}" for i, s in enumerate(args.sets + ["untrained"])}
    curves = [("loss/mlm", "held-out MLM loss"), ("accuracy/mlm", "held-out MLM accuracy"),
              ("f1/mrtd", "held-out MRTD F1"), ("retrieval/mean", "held-out retrieval probe")]
    for ax, (key, title) in zip(axes.flat, curves):
        for s in args.sets:
            series = [[(v["tokens"], v[key]) for v in runs[(s, seed)]["valid"] if key in v]
                      for seed in args.seeds]
            series = [x for x in series if x]
            if not series:
                continue
            n = min(len(x) for x in series)
            xs = [series[0][i][0] for i in range(n)]
            ys = [[x[i][1] for x in series] for i in range(n)]
            ax.plot(xs, [statistics.mean(y) for y in ys], label=s, color=color[s])
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], alpha=0.2,
                            color=color[s])
        ax.set_title(title)
        ax.set_xlabel("tokens")
        ax.legend()
    ax = axes.flat[4]
    width = 0.8 / (len(args.sets) + 1)
    for i, s in enumerate(args.sets + ["untrained"]):
        values = ([[runs[(s, seed)]["retrieval"][layer] for seed in args.seeds] for layer in layers]
                  if s != "untrained" else [[floor_retrieval[layer]] for layer in layers])
        means = [statistics.mean(v) for v in values]
        errors = [statistics.stdev(v) if len(v) > 1 else 0 for v in values]
        ax.bar([layer + i * width for layer in layers], means, width, yerr=errors, label=s,
               color=color[s])
    ax.set_title("test retrieval accuracy@1 by layer")
    ax.set_xlabel("layer")
    ax.legend()
    ax = axes.flat[5]
    names = args.sets + ["untrained"]
    values = [[v for seed in args.seeds for v in runs[(s, seed)]["pos"]] for s in args.sets]
    values.append(floor_pos)
    means = [statistics.mean(v) for v in values]
    ax.bar(names, means, yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in values],
           color=[color[n] for n in names])
    ax.set_ylim(min(means) - 5, max(means) + 2)
    ax.set_title(f"silver POS test {pos_main}")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "ablation.png"), dpi=80)
    return 0


if __name__ == "__main__":
    sys.exit(main())
