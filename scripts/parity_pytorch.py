#!/usr/bin/env python3
"""Training parity: repeats an xlme training run step by step in PyTorch and compares.

xlme's side is a trace written by `xlme-parity-trace` (tests/tools/parity_trace.cpp): the initial
weights, every micro-batch with the generator's draws as the discriminator saw them, and after
every step the terms, the gradient norm, the learning rate and every parameter. This side is
written from ../shared/DESIGN.md's formulas and does not call xlme: the encoder is
scripts/xlme_reference.py's (the model users load the export with), the heads, the losses and
their normalization, AdamW (torch.optim.AdamW), the schedule and the clipping are written here.
It trains from the same initial weights on the same batches and checks at every step that each
term's loss, the gradient norm and every parameter agree within float32 tolerances.

    scripts/parity_pytorch.py --binary build/xlme-parity-trace --objectives xlme --steps 50 \\
        --out build/parity/xlme
    scripts/parity_pytorch.py --trace build/parity/xlme            # compare an existing trace

With --peer hf the encoders and heads are HuggingFace's ElectraForMaskedLM / ElectraForPreTraining
(transformers, eager attention) with xlme's initial weights transplanted, for a trace of a model
without the relative bias (model.relative_position.enabled=false: absolute positions only, as
ELECTRA): the same batches and draws, the same AdamW, schedule and clipping; the loss curves are
printed side by side and compared like the reference's.

Prints one line per step (the largest differences) and a summary line; exits 1 when a figure is
outside its tolerance, naming the step and the term or parameter.
"""
import argparse
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xlme_reference  # noqa: E402

MONO, PARA = 0, 1


def read_config(lines):
    """The trace's KEY=VALUE lines (xlme's resolved config) as a dict of strings."""
    config = {}
    for line in lines.splitlines():
        key, _, value = line.partition("=")
        config[key] = value.strip().strip('"').strip("'")
    return config


class Setup:
    """What the run needs from the config, read by name."""

    def __init__(self, c):
        self.objectives = c["objectives.set"]
        self.rtd_weight = float(c["objectives.rtd_weight"])
        self.lr, self.warmup = float(c["train.lr"]), int(c["train.warmup_steps"])
        self.steps = int(c["train.steps"])
        self.betas = (float(c["train.adam_beta1"]), float(c["train.adam_beta2"]))
        self.eps, self.weight_decay = float(c["train.adam_eps"]), float(c["train.weight_decay"])
        self.clip = float(c["train.clip_norm"])
        self.eps_ln = float(c["model.layer_norm_eps"])
        hidden, heads = int(c["model.hidden_size"]), int(c["model.heads"])
        gen_hidden = int(c["model.generator.hidden_size"]) or hidden
        gen_heads = int(c["model.generator.heads"]) or heads
        assert float(c["model.dropout"]) == 0 and float(c["model.attention_dropout"]) == 0, \
            "parity needs model.dropout=0 and model.attention_dropout=0"
        self.encoder_config = {
            "relative_position": {
                "enabled": c["model.relative_position.enabled"] == "true",
                "gated": c["model.relative_position.gated"] == "true",
                "shared_across_layers":
                    c["model.relative_position.shared_across_layers"] == "true",
                "num_buckets": int(c["model.relative_position.num_buckets"]),
                "max_distance": int(c["model.relative_position.max_distance"]),
            },
            "absolute_positions": c["model.absolute_positions"] == "true",
            "norm": c["model.norm"],
            "layer_norm_eps": self.eps_ln,
            "layers": int(c["model.layers"]), "heads": heads, "hidden_size": hidden,
            "generator": {"layers": int(c["model.generator.layers"]), "heads": gen_heads,
                          "hidden_size": gen_hidden},
            "share_layers": c["model.share_layers"],
            "dropout": 0.0, "attention_dropout": 0.0,
        }
        self.electra = self.objectives in ("xlme", "xlme-mono")
        self.tasks = [MONO] + ([PARA] if self.objectives in ("xlme", "mlm+tlm") else [])

    def terms(self, task):
        if task == MONO:
            return ["mlm", "mrtd"] if self.electra else ["mlm"]
        return ["tlm", "trtd"] if self.electra else ["tlm"]

    def schedule(self, step):
        """The learning rate of update `step` (0-based): linear warm-up, then linear decay to 0."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.warmup == self.steps:
            return self.lr
        return self.lr * max(self.steps - step, 0) / (self.steps - self.warmup)


def masked_lm_head(w, prefix, hidden, table):
    """dense -> GELU (erf) -> LayerNorm -> the tied token table + a bias: [N, H] -> [N, V]."""
    x = F.gelu(F.linear(hidden, w[prefix + ".dense.weight"], w[prefix + ".dense.bias"]))
    x = F.layer_norm(x, (x.shape[-1],), w[prefix + ".norm.weight"], w[prefix + ".norm.bias"],
                     setup.eps_ln)
    return F.linear(x, table, w[prefix + ".output_bias"])


def rtd_head(w, hidden):
    """dense -> GELU -> one logit per token: [B, T, H] -> [B, T]."""
    x = F.gelu(F.linear(hidden, w["discriminator_head.dense.weight"],
                        w["discriminator_head.dense.bias"]))
    return F.linear(x, w["discriminator_head.output.weight"],
                    w["discriminator_head.output.bias"]).squeeze(-1)


def encode(w, name, ids, positions, padding):
    """The last hidden states [B, T, H] of encoder `name` (generator or discriminator)."""
    if peer:
        return peer.encode(name, ids, positions, padding)
    return xlme_reference.Encoder(setup.encoder_config, w, name).forward(ids, positions,
                                                                        padding)[-1]


class HuggingFacePeer:
    """HuggingFace's ELECTRA with xlme's weights: `weights` maps xlme's parameter names to the
    peer's own Parameters (the shared token and position tables are one Parameter each), so that
    the optimizer and the comparison go by xlme's names."""

    def __init__(self, c, init, names):
        import transformers
        cfg = setup.encoder_config
        if cfg["relative_position"]["enabled"] or not cfg["absolute_positions"] or \
                cfg["norm"] != "post" or cfg["share_layers"] != "none":
            raise SystemExit("--peer hf needs a trace of a post-LN model with absolute positions, "
                             "no relative bias and no layer sharing (ELECTRA's architecture): "
                             "model.relative_position.enabled=false")

        def config(shape, ffn):
            return transformers.ElectraConfig(
                vocab_size=int(c["model.vocab_size"]),
                embedding_size=int(c["model.embedding_size"]) or cfg["hidden_size"],
                hidden_size=shape["hidden_size"], num_hidden_layers=shape["layers"],
                num_attention_heads=shape["heads"],
                intermediate_size=ffn,
                hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                max_position_embeddings=int(c["model.max_positions"]), type_vocab_size=1,
                layer_norm_eps=setup.eps_ln, attn_implementation="eager",
                # nn.Embedding(padding_idx=pad) gives <pad>'s row no gradient from the lookup;
                # HF's default 0 is xlme's <s>.
                pad_token_id=1)

        ffn = int(c["model.ffn_size"])
        generator_ffn = int(c["model.generator.ffn_size"]) or ffn
        self.models = {}
        if setup.electra:
            self.models["generator"] = transformers.ElectraForMaskedLM(
                config(cfg["generator"], generator_ffn))
            self.models["discriminator"] = transformers.ElectraForPreTraining(config(cfg, ffn))
            self.heads = {"generator_head": self.models["generator"]}
        else:
            self.models["discriminator"] = transformers.ElectraForMaskedLM(config(cfg, ffn))
            self.heads = {"mlm_head": self.models["discriminator"]}
        first = next(iter(self.models.values())).electra.embeddings
        for model in self.models.values():
            model.eval()  # no dropout (their rates are 0 anyway)
            emb = model.electra.embeddings
            emb.word_embeddings, emb.position_embeddings = (first.word_embeddings,
                                                            first.position_embeddings)
            emb.token_type_embeddings.weight.data.zero_()
            emb.token_type_embeddings.weight.requires_grad_(False)
        self.weights = {}
        for name in names:
            target = self.parameter(name)
            with torch.no_grad():
                target.copy_(init["param." + name])
            self.weights[name] = target
        for model in self.heads.values():  # the output projection is the token table itself
            model.generator_lm_head.weight = first.word_embeddings.weight

    def parameter(self, name):
        parts = name.split(".")
        if parts[0] == "embeddings":
            emb = next(iter(self.models.values())).electra.embeddings
            table = emb.word_embeddings if parts[1] == "token" else emb.position_embeddings
            return table.weight
        if parts[0] in ("generator_head", "mlm_head"):
            model = self.heads[parts[0]]
            if parts[1] == "output_bias":
                return model.generator_lm_head.bias
            module = {"dense": model.generator_predictions.dense,
                      "norm": model.generator_predictions.LayerNorm}[parts[1]]
            return getattr(module, parts[2])
        if parts[0] == "discriminator_head":
            heads = self.models["discriminator"].discriminator_predictions
            module = {"dense": heads.dense, "output": heads.dense_prediction}[parts[1]]
            return getattr(module, parts[2])
        electra = self.models[parts[0]].electra
        if parts[1] == "embedding_norm":
            return getattr(electra.embeddings.LayerNorm, parts[2])
        if parts[1] == "embedding_projection":
            return getattr(electra.embeddings_project, parts[2])
        layer = electra.encoder.layer[int(parts[2])]
        sub, leaf = ".".join(parts[3:-1]), parts[-1]
        module = {"attention.query": layer.attention.self.query,
                  "attention.key": layer.attention.self.key,
                  "attention.value": layer.attention.self.value,
                  "attention.output": layer.attention.output.dense,
                  "attention_norm": layer.attention.output.LayerNorm,
                  "ffn.intermediate": layer.intermediate.dense,
                  "ffn.output": layer.output.dense,
                  "ffn_norm": layer.output.LayerNorm}[sub]
        return getattr(module, leaf)

    def encode(self, name, ids, positions, padding):
        return self.models[name].electra(input_ids=ids, attention_mask=(~padding).long(),
                                         token_type_ids=torch.zeros_like(ids),
                                         position_ids=positions).last_hidden_state

    def lm_logits(self, head, hidden):
        model = self.heads[head]
        return model.generator_lm_head(model.generator_predictions(hidden))

    def rtd_logits(self, hidden):
        return self.models["discriminator"].discriminator_predictions(hidden)


def micro_batch_sums(w, batch):
    """{term: (loss sum, count)} of one micro-batch; the loss sums keep their graph."""
    ids, labels, masked = batch["input_ids"], batch["labels"], batch["masked"]
    padding, positions = batch["padding"], batch["positions"]
    table = w["embeddings.token.weight"]
    flat = masked.reshape(-1)
    targets = labels.reshape(-1)[flat]
    gen_term, rtd_term = setup.terms(int(batch["task"][0]))[0], None
    if setup.electra:
        rtd_term = setup.terms(int(batch["task"][0]))[1]
        hidden = encode(w, "generator", ids, positions, padding)
        head = "generator_head"
    else:
        hidden = encode(w, "discriminator", ids, positions, padding)
        head = "mlm_head"
    gathered = hidden.reshape(-1, hidden.shape[-1])[flat]
    logits = (peer.lm_logits(head, gathered) if peer else
              masked_lm_head(w, head, gathered, table))
    sums = {gen_term: (F.cross_entropy(logits, targets, reduction="sum"), int(flat.sum()))}
    if setup.electra:
        # The discriminator reads the originals with xlme's draws put in; a draw equal to the
        # original counts as original.
        corrupted = batch["discriminator_input"]
        assert torch.equal(corrupted[~masked], labels[~masked]), "draws outside masked positions"
        replaced = (corrupted != labels).float()
        real = (~padding).float()
        hidden = encode(w, "discriminator", corrupted, positions, padding)
        logits = peer.rtd_logits(hidden) if peer else rtd_head(w, hidden)
        bce = F.binary_cross_entropy_with_logits(logits, replaced, weight=real, reduction="sum")
        sums[rtd_term] = (bce, int(real.sum()))
    return sums


def load_step(path):
    tensors, meta = xlme_reference.read_safetensors(path)
    batches = {}
    for name, t in tensors.items():
        if name.startswith("batch."):
            _, index, field = name.split(".", 2)
            batches.setdefault(int(index), {})[field] = t
    params = {k[len("param."):]: v for k, v in tensors.items() if k.startswith("param.")}
    return [batches[i] for i in sorted(batches)], params, meta


def show_batches(trace, spm, rows):
    """Step 1's micro-batches as text: what the model reads and predicts."""
    import sentencepiece
    processor = sentencepiece.SentencePieceProcessor(model_file=spm)
    size = processor.get_piece_size()

    def piece(i):  # xlme's own layout: the model's ids, <s> <pad> </s> <unk> first, <mask> last
        return "<mask>" if i == size else processor.id_to_piece(i)

    batches, _, _ = load_step(os.path.join(trace, "step_1.safetensors"))
    for b, batch in enumerate(batches):
        task = "MRTD" if int(batch["task"][0]) == MONO else "TRTD"
        print(f"micro-batch {b} ({task}), {tuple(batch['labels'].shape)}")
        for r in range(min(rows, batch["labels"].shape[0])):
            words = []
            for t in range(batch["labels"].shape[1]):
                if batch["padding"][r, t]:
                    break
                label = piece(int(batch["labels"][r, t]))
                if batch["masked"][r, t]:
                    label = f"[{label}]"
                    if "discriminator_input" in batch and \
                            batch["discriminator_input"][r, t] != batch["labels"][r, t]:
                        label += "{" + piece(int(batch["discriminator_input"][r, t])) + "}"
                words.append(label)
            print(f"  pos0={int(batch['positions'][r, 0])}: " + " ".join(words))


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


peer = None


def main():
    global setup, peer
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="an existing trace folder (else --binary writes --out)")
    parser.add_argument("--binary", help="xlme-parity-trace, run first with the options below")
    parser.add_argument("--out", help="the trace folder --binary writes")
    parser.add_argument("--objectives", default="xlme", help="objectives.set for --binary")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--set", action="append", default=[], help="more KEY=VALUE for --binary")
    parser.add_argument("--peer", choices=["reference", "hf"], default="reference",
                        help="reference: scripts/xlme_reference.py's encoder and the heads here; "
                        "hf: HuggingFace's ELECTRA with the weights transplanted")
    # Float32 round-off between two correct implementations stays far below these tolerances over
    # 50 steps (docs/testing.md has the measured differences).
    parser.add_argument("--loss-rtol", type=float, default=1e-5,
                        help="each term's loss, relative")
    parser.add_argument("--norm-rtol", type=float, default=1e-5,
                        help="the gradient norm, relative")
    parser.add_argument("--param-atol", type=float, default=1e-5,
                        help="every parameter, absolute (largest element difference)")
    parser.add_argument("--show", type=int, default=0, metavar="ROWS",
                        help="print the first ROWS rows of step 1's micro-batches decoded with "
                        "--spm (masked pieces in [ ], the generator's replacements as {x})")
    parser.add_argument("--spm", help="the SentencePiece model of the trace's data, for --show")
    parser.add_argument("--perturb-rtd-weight", type=float, default=1.0,
                        help="multiply lambda here by this (a check that the comparison fails)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    trace = args.trace or args.out
    if args.binary:
        subprocess.run([args.binary, "--out", trace, "--steps", str(args.steps),
                        f"objectives.set={args.objectives}"] + args.set, check=True)
    if args.show:
        show_batches(trace, args.spm, args.show)
    init, meta = xlme_reference.read_safetensors(os.path.join(trace, "init.safetensors"))
    config = read_config(meta["config"])
    setup = Setup(config)
    setup.rtd_weight *= args.perturb_rtd_weight
    names = meta["parameters"].split()
    if args.peer == "hf":
        peer = HuggingFacePeer(config, init, names)
        weights = peer.weights
    else:
        weights = {name: init["param." + name].clone().requires_grad_(True) for name in names}
    decay = [weights[n] for n in names if weights[n].dim() >= 2]
    no_decay = [weights[n] for n in names if weights[n].dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": setup.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=setup.lr, betas=setup.betas, eps=setup.eps, foreach=False)
    worst = {"loss": 0.0, "norm": 0.0, "param": 0.0}
    failures = []
    step = 0
    while os.path.exists(os.path.join(trace, f"step_{step + 1}.safetensors")):
        step += 1
        batches, expected, meta = load_step(os.path.join(trace, f"step_{step}.safetensors"))
        # Each term is normalized by its count over the whole step (every micro-batch).
        sums = [micro_batch_sums(weights, b) for b in batches]
        counts = {}
        for s in sums:
            for term, (_, n) in s.items():
                counts[term] = counts.get(term, 0) + n
        optimizer.zero_grad(set_to_none=True)
        totals = {}
        for s in sums:
            loss = 0.0
            for term, (value, _) in s.items():
                weight = setup.rtd_weight if term in ("mrtd", "trtd") else 1.0
                loss = loss + weight * value / max(counts[term], 1)
                totals[term] = totals.get(term, 0.0) + float(value.detach())
            loss.backward()
        grads = [p.grad for p in weights.values() if p.grad is not None]
        norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
        if setup.clip > 0 and norm > setup.clip:
            for g in grads:
                g.mul_(setup.clip / (norm + 1e-6))
        lr = setup.schedule(step - 1)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        # The comparison.
        line = [f"step {step}"]
        if relative(lr, float(meta["lr"])) > 1e-12:
            failures.append(f"step {step}: lr {lr} here, {meta['lr']} in xlme")
        for term, total in sorted(totals.items()):
            mine, theirs = total / max(counts[term], 1), float(meta[f"term.{term}"])
            r = relative(mine, theirs)
            worst["loss"] = max(worst["loss"], r)
            line.append(f"{term} {mine:.6f}/{theirs:.6f}")
            if r > args.loss_rtol:
                failures.append(f"step {step}: {term} loss {mine:.8g} here, {theirs:.8g} in xlme "
                                f"(relative difference {r:.2e} > {args.loss_rtol})")
        r = relative(norm, float(meta["grad_norm"]))
        worst["norm"] = max(worst["norm"], r)
        line.append(f"|g| {norm:.6f}/{float(meta['grad_norm']):.6f}")
        if r > args.norm_rtol:
            failures.append(f"step {step}: gradient norm {norm:.8g} here, {meta['grad_norm']} in "
                            f"xlme (relative difference {r:.2e} > {args.norm_rtol})")
        largest, where = 0.0, ""
        for name in names:
            d = float((weights[name].detach() - expected[name]).abs().max())
            if d > largest:
                largest, where = d, name
        worst["param"] = max(worst["param"], largest)
        line.append(f"max|dp| {largest:.2e} ({where})")
        if largest > args.param_atol:
            failures.append(f"step {step}: parameter {where} differs by {largest:.3e} "
                            f"(> {args.param_atol})")
        print("  ".join(line), flush=True)
    if step == 0:
        print(f"parity: no step_1.safetensors in {trace}", file=sys.stderr)
        return 1
    print(f"parity ({setup.objectives} against {args.peer}, {step} steps): largest relative loss difference "
          f"{worst['loss']:.2e} (tolerance {args.loss_rtol}), gradient norm {worst['norm']:.2e} "
          f"({args.norm_rtol}), largest parameter difference {worst['param']:.2e} "
          f"({args.param_atol})")
    for failure in failures[:20]:
        print("FAIL " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
