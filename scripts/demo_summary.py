#!/usr/bin/env python3
"""The quickstart's closing summary of a pre-training run and its retrieval evaluation.

    scripts/demo_summary.py RUN_DIR DATA_DIR

RUN_DIR holds metrics.jsonl, retrieval/results.json (xlme-finetune's retrieval with
compare_untrained) and, when present, pos/ and pos-untrained/results.json (the silver POS task,
pre-trained and random weights); DATA_DIR the corpus (shards/, spm.model). Prints the training and held-out
figures at the first and last step with the generator's unigram floors beside them, and retrieval
accuracy@1 per pair for the trained model, the untrained one and the bag-of-sub-words floor
(scripts/bag_of_subwords_retrieval.py: what shared pieces alone give), then the POS test F1 of
both.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bag_of_subwords_retrieval  # noqa: E402
import sentencepiece  # noqa: E402


def main():
    run, data = sys.argv[1], sys.argv[2]
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    train = [r for r in records if r.get("kind", "train") == "train"]
    valid = [r for r in records if r.get("kind") == "validation"]
    first, last = train[0], train[-1]
    shards = os.path.join(data, "shards")
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(shards) for f in fs)
    print()
    print(f"data: {data} ({size / 1e6:.0f} MB of shards)")
    print(f"steps: {last['step']}, tokens seen: {last.get('tokens_seen', 0):,}, "
          f"last tokens/s: {last.get('tokens_per_s', 0):,.0f}")
    print(f"{'training batches':26}{'step ' + str(first['step']):>12}{'step ' + str(last['step']):>12}")
    keys = ("loss/mlm", "loss/tlm", "loss/mrtd", "loss/trtd", "accuracy/mlm", "accuracy/tlm",
            "f1/mrtd", "f1/trtd")
    for key in keys:
        if key in first and key in last:
            print(f"  {key:24}{first[key]:12.4f}{last[key]:12.4f}")
    if len(valid) >= 2:
        a, b = valid[0], valid[-1]
        print(f"{'held-out validation':26}{'step ' + str(a['step']):>12}{'step ' + str(b['step']):>12}")
        floors = tuple(f"unigram_accuracy/{t}" for t in ("mlm", "tlm"))
        for key in keys[:6] + floors + keys[6:] + ("retrieval/mean",):
            if key in a and key in b and a[key] is not None and b[key] is not None:
                print(f"  {key:24}{a[key]:12.4f}{b[key]:12.4f}")
        print("  (unigram_accuracy: always predicting the most frequent masked piece; a generator "
              "at that figure\n   predicts that piece everywhere)")
    results = json.load(open(os.path.join(run, "retrieval", "results.json")))
    layer = "layer " + str(next(line for line in results["config"].splitlines()
                                if line.strip().startswith("layer:")).split(":")[1].strip())
    trained = results["trained"]["layers"][layer]
    untrained = results["untrained"]["layers"][layer]
    data_dir = next(line for line in results["config"].splitlines()
                    if line.strip().startswith("data_dir:")).split(":", 1)[1].strip().strip('"')
    pairs = [p for p in trained if p != "mean"]
    processor = sentencepiece.SentencePieceProcessor(model_file=os.path.join(data, "spm.model"))
    floor = {p: bag_of_subwords_retrieval.pair_accuracy(processor, data_dir, p)["accuracy"]
             for p in pairs}
    floor["mean"] = sum(floor.values()) / len(pairs)
    print()
    print(f"retrieval accuracy@1 on the held-out test pairs ({layer}, mean of both directions):")
    print(f"  {'pair':12}{'trained':>10}{'untrained':>11}{'bag of sub-words':>18}")
    for pair in trained:
        print(f"  {pair:12}{trained[pair]['accuracy']:10.2f}{untrained[pair]['accuracy']:11.2f}"
              f"{floor[pair]:18.2f}")
    pos = {}
    for name, folder in (("trained", "pos"), ("untrained", "pos-untrained")):
        path = os.path.join(run, folder, "results.json")
        if os.path.exists(path):
            pos[name] = json.load(open(path))["test"]["average"]
    if pos:
        print()
        print("silver English POS (scripts/silver_udpos.sh), test F1 over fine-tuning seeds, "
              "mean ± std:")
        for name, result in pos.items():
            values = ", ".join(f"{v:.2f}" for v in result["values"])
            covered = (f"; over {len(result['covers'])} of {result['of']} languages"
                       if "covers" in result else "")
            print(f"  {name:12}{result['mean']:6.2f} ± {result['std']:.2f}   ({values}{covered})")
    print()
    print(f"curves: {run}/plots/summary.png; export: {run}/export/; "
          f"retrieval: {run}/retrieval/results.json; POS: {run}/pos*/results.json")
    print("The bag-of-sub-words column is what shared pieces alone give (names, numbers and")
    print("placeholders of the translation catalogs): random weights keep part of it, and a small")
    print("CPU run loses it long before cross-lingual alignment forms. The POS task is where")
    print("pre-training helps at this size. docs/learning.md has what this run can and cannot show.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
