#!/usr/bin/env python3
"""The bag-of-sub-words floor of a retrieval evaluation: what shared tokens alone give.

Each sentence becomes the vector of its SentencePiece pieces' counts (special tokens left out),
retrieval is XTREME's and xlme-finetune's (cosine similarity, the nearest candidate, accuracy@1 in
both directions and their mean, ties to the lowest index) on the line-aligned files
<data_dir>/<a>-<b>.<a> and <a>-<b>.<b>. An encoder whose mean-pooled representations beat this
floor has learned more than which pieces two sentences share; random weights mostly sit near it.

    scripts/bag_of_subwords_retrieval.py --spm data/demo/spm.model \\
        --data-dir data/demo/heldout/test --pairs en-de en-fr     # or --results results.json

Prints one line per pair and the mean (percent), and with --json writes them as JSON.
"""
import argparse
import json
import os
import sys

import numpy as np
import sentencepiece


def bag(processor, lines):
    """[N, V] float64 piece counts of each line (ids as SentencePiece numbers them)."""
    vectors = np.zeros((len(lines), processor.get_piece_size()))
    for i, line in enumerate(lines):
        for piece in processor.encode(line):
            vectors[i, piece] += 1
    return vectors


def nearest(queries, candidates):
    """Index of each query's most similar candidate by cosine; ties to the lowest index."""
    def unit(x):
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return x / np.maximum(norms, 1e-300)
    sim = unit(queries) @ unit(candidates).T
    return np.argmax(sim, axis=1)  # numpy's argmax returns the first maximum


def pair_accuracy(processor, data_dir, pair):
    a, b = pair.split("-", 1)
    with open(os.path.join(data_dir, f"{pair}.{a}"), encoding="utf-8") as f:
        left = f.read().splitlines()
    with open(os.path.join(data_dir, f"{pair}.{b}"), encoding="utf-8") as f:
        right = f.read().splitlines()
    if len(left) != len(right):
        raise SystemExit(f"{data_dir}/{pair}.*: {len(left)} and {len(right)} lines; the files of a "
                         "pair must be line-aligned")
    x, y = bag(processor, left), bag(processor, right)
    gold = np.arange(len(left))
    a_to_b = float((nearest(x, y) == gold).mean()) * 100
    b_to_a = float((nearest(y, x) == gold).mean()) * 100
    return {"a_to_b": a_to_b, "b_to_a": b_to_a, "accuracy": (a_to_b + b_to_a) / 2,
            "sentences": len(left)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spm", required=True, help="the SentencePiece model the encoder uses")
    parser.add_argument("--data-dir", required=True, help="folder of <a>-<b>.<a|b> files")
    parser.add_argument("--pairs", nargs="*", default=[], help="pairs such as en-de")
    parser.add_argument("--results", help="an xlme-finetune retrieval results.json: its pairs")
    parser.add_argument("--json", help="write the accuracies here")
    args = parser.parse_args()
    pairs = list(args.pairs)
    if args.results:
        with open(args.results) as f:
            layers = json.load(f)["trained"]["layers"]
        pairs += [p for p in next(iter(layers.values())) if p != "mean" and p not in pairs]
    if not pairs:
        raise SystemExit("bag_of_subwords_retrieval.py: no pairs (--pairs or --results)")
    processor = sentencepiece.SentencePieceProcessor(model_file=args.spm)
    out = {pair: pair_accuracy(processor, args.data_dir, pair) for pair in pairs}
    out["mean"] = {"accuracy": sum(v["accuracy"] for v in out.values()) / len(pairs)}
    for pair, v in out.items():
        print(f"{pair:12}{v['accuracy']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
