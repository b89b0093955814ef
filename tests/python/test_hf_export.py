#!/usr/bin/python3
"""Checks an xlme export through HuggingFace `transformers` (driven by
tests/integration/hf_export_test.cpp; transformers on PYTHONPATH):

    test_hf_export.py --model DIR --inputs IN.safetensors --expected EXPECTED.safetensors \
        [--tokens TOKENS.json] [--tolerance 1e-4]

1. AutoConfig + AutoModel.from_config(trust_remote_code=True) from the folder, the weights read
   by xlme_reference.read_safetensors (every parameter of the model must be in the file; what
   the file has beyond them must be the pre-training heads or the generator): every hidden state
   must equal EXPECTED's hidden.<i> (the C++ encoder's) within --tolerance at the real positions.
2. AutoModel.from_pretrained(DIR, trust_remote_code=True) must load every parameter and give the
   same hidden states, AutoModelForTokenClassification.from_pretrained miss only its new head:
   from the export itself where the `safetensors` package imports, else from a copy of the
   folder with the weights as pytorch_model.bin.
3. The sequence, token and question-answering heads (AutoModelFor*.from_config): their encoder
   gives the same hidden states; one training step in train mode yields a finite loss and
   gradients on the head and on the first layer's attention.
4. AutoTokenizer.from_pretrained(DIR, trust_remote_code=True): TOKENS.json's texts give <s>, the
   C++ tokenizer's ids, </s>; the special ids and the vocabulary size are the export's.
Prints one JSON line ({"transformers": VERSION, "max_abs_diff": [...], "from_pretrained": [...],
...}); exits 1
with a message on the first failed check.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

# Dynamic modules go to a fresh folder: parallel runs and older copies do not interfere.
_MODULES = tempfile.TemporaryDirectory(prefix="xlme-hf-modules-")
os.environ["HF_MODULES_CACHE"] = _MODULES.name
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (AutoConfig, AutoModel, AutoModelForQuestionAnswering,  # noqa: E402
                          AutoModelForSequenceClassification, AutoModelForTokenClassification,
                          AutoTokenizer)

transformers.logging.set_verbosity_error()  # not the "newly initialized head" advice


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def load_weights(model, weights, what):
    """Loads `weights` (export names) into `model` (an XlmeModel): all of its parameters must be
    there; the rest must be what XlmePreTrainedModel ignores."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    if missing:
        fail(f"{what}: parameters not in model.safetensors: {missing}")
    ignored = [k for k in weights if k not in own]
    patterns = type(model)._keys_to_ignore_on_load_unexpected
    stray = [k for k in ignored if not any(re.search(p, k) for p in patterns)]
    if stray:
        fail(f"{what}: tensors of model.safetensors the model has no place for: {stray}")
    for key, value in own.items():
        if tuple(weights[key].shape) != tuple(value.shape):
            fail(f"{what}: {key} is {list(weights[key].shape)} in the file, "
                 f"{list(value.shape)} in the model")
    model.load_state_dict({k: weights[k] for k in own}, strict=True)


def max_diffs(states, expected, real, what):
    if len(states) != len(expected):
        fail(f"{what}: {len(states)} hidden states, the C++ encoder has {len(expected)}")
    return [float((s.detach() - expected[i]).abs()[real].max()) for i, s in enumerate(states)]


def check(diffs, tolerance, what):
    for i, d in enumerate(diffs):
        if not d <= tolerance:
            fail(f"{what}: hidden state {i} differs from the C++ encoder's by {d} > {tolerance}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--expected", required=True)
    parser.add_argument("--tokens")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()

    sys.path.insert(0, args.model)  # the export's own copy of the reference loader
    import xlme_reference

    inputs, _ = xlme_reference.read_safetensors(args.inputs)
    expected_file, _ = xlme_reference.read_safetensors(args.expected)
    expected = [expected_file[f"hidden.{i}"] for i in range(len(expected_file))]
    ids, positions, padding = inputs["input_ids"], inputs["positions"], inputs["padding"]
    mask = (~padding).long()
    real = ~padding
    weights, _ = xlme_reference.read_safetensors(os.path.join(args.model, "model.safetensors"))
    report = {"transformers": transformers.__version__}

    # 1. from_config + the reference's safetensors reader.
    config = AutoConfig.from_pretrained(args.model, trust_remote_code=True)
    if type(config).__name__ != "XlmeConfig":
        fail(f"AutoConfig gave {type(config).__name__}, not XlmeConfig")
    model = AutoModel.from_config(config, trust_remote_code=True)
    load_weights(model, weights, "AutoModel.from_config")
    model.eval()
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                output_hidden_states=True)
    diffs = max_diffs(out.hidden_states, expected, real, "AutoModel.from_config")
    check(diffs, args.tolerance, "AutoModel.from_config")
    if not torch.equal(out.last_hidden_state, out.hidden_states[-1]):
        fail("last_hidden_state is not the last of hidden_states")
    report["max_abs_diff"] = diffs

    # 2. from_pretrained: the export itself where the safetensors package imports; elsewhere a
    #    copy of the folder with the same weights as pytorch_model.bin (the same loading logic:
    #    names, ignored tensors, the base-model prefix of the heads).
    try:
        import safetensors  # noqa: F401
        folder, report["from_pretrained_file"] = args.model, "model.safetensors"
    except ImportError:
        folder = os.path.join(_MODULES.name, "export_bin")
        shutil.copytree(args.model, folder, ignore=shutil.ignore_patterns("model.safetensors"))
        torch.save(weights, os.path.join(folder, "pytorch_model.bin"))
        report["from_pretrained_file"] = "pytorch_model.bin (no safetensors package)"
    loaded, info = AutoModel.from_pretrained(folder, trust_remote_code=True,
                                             output_loading_info=True)
    if info["missing_keys"] or info["mismatched_keys"] or info["error_msgs"]:
        fail(f"AutoModel.from_pretrained: {info}")
    loaded.eval()
    states = loaded(input_ids=ids, attention_mask=mask, position_ids=positions,
                    output_hidden_states=True).hidden_states
    report["from_pretrained"] = max_diffs(states, expected, real, "from_pretrained")
    check(report["from_pretrained"], args.tolerance, "AutoModel.from_pretrained")
    tagger, info = AutoModelForTokenClassification.from_pretrained(
        folder, trust_remote_code=True, num_labels=3, output_loading_info=True)
    if sorted(info["missing_keys"]) != ["head.output.bias", "head.output.weight"]:
        fail(f"AutoModelForTokenClassification.from_pretrained: missing {info['missing_keys']}, "
             "not only the new head")
    tagger.eval()
    states = tagger(input_ids=ids, attention_mask=mask, position_ids=positions,
                    output_hidden_states=True).hidden_states
    check(max_diffs(states, expected, real, "tagger"), args.tolerance,
          "AutoModelForTokenClassification.from_pretrained")

    # 3. The heads, as the Trainer uses them.
    heads = {}
    for auto, labels in ((AutoModelForSequenceClassification, torch.tensor([0, 2, 1])),
                         (AutoModelForTokenClassification,
                          torch.where(real, ids % 3, torch.full_like(ids, -100))),
                         (AutoModelForQuestionAnswering, None)):
        head_config = AutoConfig.from_pretrained(args.model, trust_remote_code=True, num_labels=3)
        head_model = auto.from_config(head_config, trust_remote_code=True)
        name = type(head_model).__name__
        load_weights(head_model.xlme, weights, name)
        head_model.eval()
        states = head_model(input_ids=ids, attention_mask=mask, position_ids=positions,
                            output_hidden_states=True).hidden_states
        check(max_diffs(states, expected, real, name), args.tolerance, name)
        head_model.train()
        kwargs = ({"labels": labels} if labels is not None else
                  {"start_positions": torch.tensor([1, 2, 3]),
                   "end_positions": torch.tensor([4, 5, 6])})
        loss = head_model(input_ids=ids, attention_mask=mask, **kwargs).loss
        if loss is None or not torch.isfinite(loss):
            fail(f"{name}: loss {loss}")
        loss.backward()
        grads = {k: p.grad for k, p in head_model.named_parameters()}
        for key in ("head.output.weight", "xlme.discriminator.layers.0.attention.query.weight"):
            if grads[key] is None or float(grads[key].abs().sum()) == 0:
                fail(f"{name}: no gradient on {key}")
        heads[name] = round(float(loss), 4)
    report["heads_loss"] = heads

    # 4. The tokenizer.
    if args.tokens:
        with open(args.tokens, encoding="utf-8") as f:
            tokens = json.load(f)
        tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
        special = config.special_ids
        got = {"bos": tokenizer.bos_token_id, "pad": tokenizer.pad_token_id,
               "eos": tokenizer.eos_token_id, "unk": tokenizer.unk_token_id,
               "mask": tokenizer.mask_token_id}
        if got != special:
            fail(f"tokenizer special ids {got}, the export's {special}")
        if len(tokenizer) != config.vocab_size:
            fail(f"tokenizer has {len(tokenizer)} ids, the model {config.vocab_size}")
        for text, cpp_ids in zip(tokens["texts"], tokens["ids"]):
            hf_ids = tokenizer(text)["input_ids"]
            want = [special["bos"]] + cpp_ids + [special["eos"]]
            if hf_ids != want:
                fail(f"tokenizer: {text!r} -> {hf_ids}, the C++ tokenizer's {want}")
        report["tokenizer"] = type(tokenizer).__name__
    print(json.dumps(report))


if __name__ == "__main__":
    main()
