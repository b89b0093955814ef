#!/usr/bin/env python3
"""Retrieval on held-out translation pairs two ways, for a trained export and random weights.

XTREME's method (what xlme-finetune's retrieval task computes: <s> pieces </s>, the hidden states
of one layer mean-pooled over the sentence's positions, cosine similarity, the nearest candidate,
accuracy@1 in both directions and their mean) beside a language-centred variant: each language's
mean sentence vector over the evaluated set is subtracted before the cosine, which removes what
a representation says about the language alone. Both are reported; neither replaces the other.
The untrained model has the export's architecture with ELECTRA's initialization (N(0, 0.02)
weights, zero biases, unit LayerNorm scales and gate scales w) from --seed.

    scripts/retrieval_variants.py --export runs/demo/export --data-dir data/demo/heldout/test

Prints, per layer, the mean accuracy@1 (percent) over the pairs with at least --min-sentences
lines, for the trained and the untrained model, and with --json writes every pair's figures.
"""
import argparse
import json
import os
import sys

import sentencepiece
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xlme_reference  # noqa: E402


def random_like(model, seed):
    """The same Encoder with ELECTRA's initialization instead of the trained weights."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, value in model.w.items():
        if name.endswith("norm.weight") or name.endswith("gate_w"):
            weights[name] = torch.ones_like(value)
        elif name.endswith("bias"):
            weights[name] = torch.zeros_like(value)
        else:
            weights[name] = torch.randn(value.shape, generator=generator) * 0.02
    fresh = xlme_reference.Encoder(model.config, weights, model.name)
    fresh.config = model.config
    return fresh


def pooled(model, processor, lines, max_len, batch=100):
    """[layers + 1] tensors [N, H] of mean-pooled hidden states, as xlme-finetune pools them."""
    special = model.config["special_ids"]
    bos, eos, pad = special["bos"], special["eos"], special["pad"]
    ids = [[bos] + processor.encode(line)[:max_len - 2] + [eos] for line in lines]
    out = None
    for start in range(0, len(ids), batch):
        rows = ids[start:start + batch]
        width = max(len(r) for r in rows)
        x = torch.full((len(rows), width), pad, dtype=torch.int64)
        padding = torch.ones((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            x[i, :len(r)] = torch.tensor(r)
            padding[i, :len(r)] = False
        positions = torch.arange(width).expand(len(rows), width)
        states = model.hidden_states(x, positions, padding)
        real = (~padding).unsqueeze(-1).float()
        means = [(s * real).sum(1) / real.sum(1) for s in states]
        out = means if out is None else [torch.cat([a, b]) for a, b in zip(out, means)]
    return [o.double() for o in out]


def accuracy(a, b):
    """Mean of both directions' accuracy@1 (percent), cosine, ties to the lowest index."""
    a = torch.nn.functional.normalize(a, dim=1)
    b = torch.nn.functional.normalize(b, dim=1)
    sim = a @ b.T
    gold = torch.arange(len(a))
    a_to_b = (sim.argmax(1) == gold).double().mean().item()
    b_to_a = (sim.T.argmax(1) == gold).double().mean().item()
    return 50.0 * (a_to_b + b_to_a)


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True, help="an xlme-export folder")
    parser.add_argument("--data-dir", required=True, help="folder of <a>-<b>.<a>/<b> pairs")
    parser.add_argument("--min-sentences", type=int, default=1000)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1, help="the untrained model's seed")
    parser.add_argument("--json", help="write every pair's figures here")
    args = parser.parse_args()

    trained = xlme_reference.load_model(args.export)
    models = {"trained": trained, "untrained": random_like(trained, args.seed)}
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(args.export, "spm.model"))
    pairs = []
    for name in sorted(os.listdir(args.data_dir)):
        stem, ext = os.path.splitext(name)
        if "-" in stem and ext[1:] == stem.split("-")[0]:
            a, b = stem.split("-", 1)
            lines_a = read_lines(os.path.join(args.data_dir, f"{stem}.{a}"))
            lines_b = read_lines(os.path.join(args.data_dir, f"{stem}.{b}"))
            if len(lines_a) == len(lines_b) and len(lines_a) >= args.min_sentences:
                pairs.append((stem, a, b, lines_a, lines_b))
    if not pairs:
        sys.exit(f"retrieval_variants: no pair with >= {args.min_sentences} lines in "
                 f"{args.data_dir}")

    results = {}
    for label, model in models.items():
        # One language's sentences can be in several pairs (English in all): its centre is the
        # mean over every sentence of it that is evaluated.
        vectors, sums, counts = {}, {}, {}
        for stem, a, b, lines_a, lines_b in pairs:
            va, vb = pooled(model, processor, lines_a, args.max_len), \
                pooled(model, processor, lines_b, args.max_len)
            vectors[stem] = (va, vb)
            for lang, v in ((a, va), (b, vb)):
                sums[lang] = [s + x.sum(0) for s, x in zip(sums[lang], v)] if lang in sums \
                    else [x.sum(0) for x in v]
                counts[lang] = counts.get(lang, 0) + len(v[0])
        layers = len(next(iter(vectors.values()))[0])
        per = {}
        for stem, a, b, _, _ in pairs:
            va, vb = vectors[stem]
            per[stem] = {
                "xtreme": [accuracy(va[l], vb[l]) for l in range(layers)],
                "centred": [accuracy(va[l] - sums[a][l] / counts[a],
                                     vb[l] - sums[b][l] / counts[b]) for l in range(layers)]}
        results[label] = per

    print(f"retrieval accuracy@1 (mean of both directions), mean over {len(pairs)} pairs of "
          f"{args.data_dir}")
    print(f"  {'layer':8}" + "".join(f"{m + ' ' + k:>22}" for m in models
                                     for k in ("XTREME", "centred")))
    layers = len(next(iter(results["trained"].values()))["xtreme"])
    for layer in range(layers):
        row = []
        for label in models:
            for key in ("xtreme", "centred"):
                row.append(sum(p[key][layer] for p in results[label].values()) / len(pairs))
        print(f"  {layer:<8}" + "".join(f"{v:22.2f}" for v in row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
