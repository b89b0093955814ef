"""Checks an xlme export through HuggingFace `transformers` as its users load it (driven by
tests/integration/hf_export_test.cpp with the project's Python, XLME_PYTHON; offline):

    test_hf_export.py --model DIR --inputs IN.safetensors --expected EXPECTED.safetensors \
        [--heads HEADS_DIR] [--tokens TOKENS.json] [--tolerance 1e-4]
    test_hf_export.py --cases CASES.json [--tolerance 1e-4]

CASES.json is a list of {"name", "model", "inputs", "expected", "heads", "tokens"}: every case in
one process, since importing torch and transformers costs more than checking a tiny export. IN holds input_ids, positions, padding [B, T]; EXPECTED the C++ encoder's hidden.<i> [B, T, H]
and, with --heads, the C++ fine-tuning model's logits.<kind>.
1. AutoModel.from_pretrained(DIR, trust_remote_code=True) reads the export's own
   model.safetensors through the `safetensors` package: every parameter loaded, in the file's
   dtype, nothing unexpected but the pre-training heads and the generator; every hidden state
   equals EXPECTED's within --tolerance at the real positions.
2. AutoModel.from_config + xlme_reference's own safetensors reader (the loader without the
   `safetensors` package): the same hidden states.
3. AutoModelFor{SequenceClassification,TokenClassification,QuestionAnswering}.from_pretrained(DIR)
   miss only their new head (head.*); their encoder gives the same hidden states; one training
   step yields a finite loss and gradients on the head and on the first layer's attention.
4. --heads: HEADS_DIR/<kind> is the export with the weights of xlme's C++ FinetuneModel (encoder
   and a trained head, under its parameter names); AutoModelFor*.from_pretrained loads all of
   it, and the logits equal EXPECTED's logits.<kind> within --tolerance (per token at the real
   positions); save_pretrained and from_pretrained again give the same logits.
5. AutoTokenizer.from_pretrained(DIR, trust_remote_code=True): TOKENS.json's texts give <s>, the
   C++ tokenizer's ids, </s>, a pair <s> a </s></s> b </s> (xlme-finetune's framing); the special
   ids and the vocabulary size are the export's.
Prints one JSON line a case ({"case": NAME, "transformers": VERSION, "from_pretrained": [...],
"from_config": [...], "head_logits": {...}, ...}, or {"case": NAME, "error": MESSAGE} at its first
failed check); exits 1 when a case failed.
"""
import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile

# Offline, and the dynamic modules in a fresh folder: parallel runs and older copies do not
# interfere.
_MODULES = tempfile.TemporaryDirectory(prefix="xlme-hf-modules-")
os.environ["HF_MODULES_CACHE"] = _MODULES.name
os.environ["HF_HUB_OFFLINE"] = "1"

import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (AutoConfig, AutoModel, AutoModelForQuestionAnswering,  # noqa: E402
                          AutoModelForSequenceClassification, AutoModelForTokenClassification,
                          AutoTokenizer)

transformers.logging.set_verbosity_error()  # the loading reports: the checks read loading_info
transformers.logging.disable_progress_bar()

# The heads of --heads: folder name -> (Auto class, logits [..., classes] of its output).
HEADS = {
    "sequence": (AutoModelForSequenceClassification, lambda out: out.logits),
    "token": (AutoModelForTokenClassification, lambda out: out.logits),
    "qa": (AutoModelForQuestionAnswering,
           lambda out: torch.stack((out.start_logits, out.end_logits), dim=-1)),
}


class CheckFailed(Exception):
    pass


def fail(message):
    raise CheckFailed(message)


def from_pretrained(auto, folder, what, new_keys=(), **kwargs):
    """auto.from_pretrained(folder): every parameter loaded but `new_keys`, nothing unexpected but
    what XlmePreTrainedModel ignores, no shape mismatched; in eval mode."""
    model, info = auto.from_pretrained(folder, trust_remote_code=True, output_loading_info=True,
                                       **kwargs)
    if sorted(info["missing_keys"]) != sorted(new_keys):
        fail(f"{what}: missing {sorted(info['missing_keys'])}, not {sorted(new_keys)}")
    if info["unexpected_keys"] or info["mismatched_keys"] or info["error_msgs"]:
        fail(f"{what}: {info}")
    return model.eval()


def load_weights(model, weights, what):
    """Loads `weights` (export names) into `model` (an XlmeModel): all of its parameters must be
    there; the rest must be what XlmePreTrainedModel ignores."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    if missing:
        fail(f"{what}: parameters not in model.safetensors: {missing}")
    patterns = type(model)._keys_to_ignore_on_load_unexpected
    stray = [k for k in weights if k not in own and not any(re.search(p, k) for p in patterns)]
    if stray:
        fail(f"{what}: tensors of model.safetensors the model has no place for: {stray}")
    for key, value in own.items():
        if tuple(weights[key].shape) != tuple(value.shape):
            fail(f"{what}: {key} is {list(weights[key].shape)} in the file, "
                 f"{list(value.shape)} in the model")
    model.load_state_dict({k: weights[k] for k in own}, strict=True)


def max_diff(got, want, real):
    """max |got - want| over the real positions ([B, T] mask; None: everywhere)."""
    diff = (got.detach().double() - want.double()).abs()
    return float(diff[real].max() if real is not None else diff.max())


def check_states(states, expected, real, tolerance, what):
    """Hidden states against the C++ encoder's; returns the largest |difference| of each."""
    if len(states) != len(expected):
        fail(f"{what}: {len(states)} hidden states, the C++ encoder has {len(expected)}")
    diffs = [max_diff(s, e, real) for s, e in zip(states, expected)]
    for i, d in enumerate(diffs):
        if not d <= tolerance:
            fail(f"{what}: hidden state {i} differs from the C++ encoder's by {d} > {tolerance}")
    return diffs


def check_tokenizer(model_dir, tokens_path, config):
    with open(tokens_path, encoding="utf-8") as f:
        tokens = json.load(f)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    special = config.special_ids
    got = {"bos": tokenizer.bos_token_id, "pad": tokenizer.pad_token_id,
           "eos": tokenizer.eos_token_id, "unk": tokenizer.unk_token_id,
           "mask": tokenizer.mask_token_id}
    if got != special:
        fail(f"tokenizer special ids {got}, the export's {special}")
    if len(tokenizer) != config.vocab_size:
        fail(f"tokenizer has {len(tokenizer)} ids, the model {config.vocab_size}")
    bos, eos = special["bos"], special["eos"]
    for text, cpp_ids in zip(tokens["texts"], tokens["ids"]):
        hf_ids = tokenizer(text)["input_ids"]
        if hf_ids != [bos] + cpp_ids + [eos]:
            fail(f"tokenizer: {text!r} -> {hf_ids}, the C++ tokenizer's {[bos] + cpp_ids + [eos]}")
    (a, b), (a_ids, b_ids) = tokens["texts"][:2], tokens["ids"][:2]
    pair = tokenizer(a, b)["input_ids"]
    if pair != [bos] + a_ids + [eos, eos] + b_ids + [eos]:
        fail(f"tokenizer: the pair ({a!r}, {b!r}) -> {pair}, not <s> a </s></s> b </s>")
    return type(tokenizer).__name__


def check_case(case, tol):
    """Checks 1-5 on one export; returns the case's report."""
    args = argparse.Namespace(**case)
    inputs = safetensors.torch.load_file(args.inputs)
    expected_file = safetensors.torch.load_file(args.expected)
    expected = [expected_file[f"hidden.{i}"]
                for i in range(sum(k.startswith("hidden.") for k in expected_file))]
    ids, positions, padding = inputs["input_ids"], inputs["positions"], inputs["padding"]
    real = ~padding
    batch = {"input_ids": ids, "attention_mask": real.long(), "position_ids": positions}
    report = {"case": case["name"], "transformers": transformers.__version__,
              "safetensors": safetensors.__version__, "torch": torch.__version__}

    # 1. from_pretrained on the export folder itself.
    config = AutoConfig.from_pretrained(args.model, trust_remote_code=True)
    if type(config).__name__ != "XlmeConfig":
        fail(f"AutoConfig gave {type(config).__name__}, not XlmeConfig")
    weights_path = os.path.join(args.model, "model.safetensors")
    file_weights = safetensors.torch.load_file(weights_path)
    model = from_pretrained(AutoModel, args.model, "AutoModel.from_pretrained")
    for key, value in model.state_dict().items():
        if value.dtype != file_weights[key].dtype or not torch.equal(value, file_weights[key]):
            fail(f"AutoModel.from_pretrained: {key} ({value.dtype}) is not {weights_path}'s "
                 f"({file_weights[key].dtype})")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    report["from_pretrained"] = check_states(out.hidden_states, expected, real, tol,
                                             "AutoModel.from_pretrained")
    if not torch.equal(out.last_hidden_state, out.hidden_states[-1]):
        fail("last_hidden_state is not the last of hidden_states")

    # 2. from_config + the reference loader's own safetensors reader.
    # The export's own copy of the reference loader.
    spec = importlib.util.spec_from_file_location(
        f"xlme_reference_{case['name']}", os.path.join(args.model, "xlme_reference.py"))
    xlme_reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(xlme_reference)
    weights, _ = xlme_reference.read_safetensors(weights_path)
    model = AutoModel.from_config(config, trust_remote_code=True)
    load_weights(model, weights, "AutoModel.from_config")
    model.eval()
    with torch.no_grad():
        states = model(**batch, output_hidden_states=True).hidden_states
    report["from_config"] = check_states(states, expected, real, tol, "AutoModel.from_config")

    # 3. The heads on the export, as the Trainer starts from it.
    losses = {}
    for auto, new_keys, targets in (
            (AutoModelForSequenceClassification,
             ["head.dense.weight", "head.dense.bias", "head.output.weight", "head.output.bias"],
             {"labels": torch.tensor([0, 2, 1])}),
            (AutoModelForTokenClassification, ["head.output.weight", "head.output.bias"],
             {"labels": torch.where(real, ids % 3, torch.full_like(ids, -100))}),
            (AutoModelForQuestionAnswering, ["head.output.weight", "head.output.bias"],
             {"start_positions": torch.tensor([1, 2, 3]),
              "end_positions": torch.tensor([4, 5, 6])})):
        head_model = from_pretrained(auto, args.model, auto.__name__, new_keys, num_labels=3)
        name = type(head_model).__name__
        with torch.no_grad():
            states = head_model(**batch, output_hidden_states=True).hidden_states
        check_states(states, expected, real, tol, name)
        head_model.train()
        loss = head_model(**batch, **targets).loss
        if loss is None or not torch.isfinite(loss):
            fail(f"{name}: loss {loss}")
        loss.backward()
        grads = {k: p.grad for k, p in head_model.named_parameters()}
        for key in ("head.output.weight", "xlme.discriminator.layers.0.attention.query.weight"):
            if grads[key] is None or float(grads[key].abs().sum()) == 0:
                fail(f"{name}: no gradient on {key}")
        losses[name] = round(loss.item(), 4)
    report["heads_loss"] = losses

    # 4. Fine-tuned heads against the C++ fine-tuning model.
    if args.heads:
        report["head_logits"] = {}
        for kind, (auto, logits_of) in HEADS.items():
            folder = os.path.join(args.heads, kind)
            what = f"{auto.__name__}.from_pretrained({folder})"
            head_model = from_pretrained(auto, folder, what)
            with torch.no_grad():
                logits = logits_of(head_model(**batch))
            want = expected_file[f"logits.{kind}"]
            if logits.shape != want.shape:
                fail(f"{what}: logits {list(logits.shape)}, the C++ model's {list(want.shape)}")
            d = max_diff(logits, want, real if logits.dim() == 3 else None)
            if not d <= tol:
                fail(f"{what}: logits differ from the C++ fine-tuning model's by {d} > {tol}")
            report["head_logits"][kind] = d
            with tempfile.TemporaryDirectory() as saved:
                head_model.save_pretrained(saved)
                again = from_pretrained(auto, saved, f"{what} after save_pretrained")
                with torch.no_grad():
                    if not torch.equal(logits_of(again(**batch)), logits):
                        fail(f"{what}: other logits after save_pretrained and from_pretrained")

    # 5. The tokenizer.
    if args.tokens:
        report["tokenizer"] = check_tokenizer(args.model, args.tokens, config)
    return report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases")
    parser.add_argument("--model")
    parser.add_argument("--inputs")
    parser.add_argument("--expected")
    parser.add_argument("--heads")
    parser.add_argument("--tokens")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    if args.cases:
        with open(args.cases, encoding="utf-8") as f:
            cases = json.load(f)
    elif args.model and args.inputs and args.expected:
        cases = [{"name": os.path.basename(os.path.normpath(args.model)), "model": args.model,
                  "inputs": args.inputs, "expected": args.expected, "heads": args.heads,
                  "tokens": args.tokens}]
    else:
        parser.error("give --cases, or --model, --inputs and --expected")
    failed = 0
    for case in cases:
        case = {"heads": None, "tokens": None, **case}
        try:
            report = check_case(case, args.tolerance)
        except CheckFailed as error:
            report = {"case": case["name"], "error": str(error)}
        except Exception as error:  # an unexpected error in one case must not hide the others
            report = {"case": case["name"], "error": f"{type(error).__name__}: {error}"}
        failed += "error" in report
        print(json.dumps(report), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
