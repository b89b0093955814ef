"""Checks what a HuggingFace user does with an xlme export beyond loading the encoder (driven by
tests/integration/hf_client_test.cpp with the project's Python, XLME_PYTHON; offline):

    test_hf_client.py --model DIR --xlmr-model DIR2 --mlm-model DIR3 \
        --expected EXPECTED.safetensors --tokens TOKENS.json [--tolerance 1e-4]

DIR is an export with the generator (`--with-generator`, own vocabulary layout), DIR2 one in
XLM-R's layout (a BPE SentencePiece model) without it, DIR3 the masked-LM baseline's (objectives.set
mlm, `--with-generator`). EXPECTED holds input_ids and padding [B, T] (right padded), the C++
generator's logits gen_logits [B, T, V], the baseline's mlm_logits [B, T, V] and the
discriminator's replaced-token logits rtd_logits [B, T] (default positions).
TOKENS.json: {"own": {"texts": [...], "ids": [[...]]}, "xlmr": {...}}, the C++ tokenizer's ids
of each text (without <s>, </s>).
  masked_lm: AutoModelForMaskedLM (DIR, DIR3) and AutoModelForPreTraining (DIR) load everything
      they hold and give the C++ logits within --tolerance; pipeline("fill-mask") ranks the
      model's logits; on DIR2, AutoModelForMaskedLM says to export with --with-generator.
  padding: left and right padding give the same outputs (position ids from the attention mask);
      pad ids without an attention_mask warn as transformers' own models (DeBERTa) warn.
  tokenizer: AutoTokenizer gives the fast tokenizer (tokenizer.json), the C++ ids on every text of
      both layouts, word_ids() and offsets; the token-classification pipeline gives spans.
  trainer: transformers' Trainer fine-tunes the token head a few steps; save_model and
      from_pretrained give identical predictions.
Prints one JSON line {"transformers": VERSION, "<check>": {"ok": bool, "error": ..., ...}}; each
check runs whatever the others gave, and the exit code is 1 when one failed.
"""
import argparse
import json
import logging
import os
import sys
import tempfile
import traceback

# Offline, and the dynamic modules in a fresh folder: parallel runs and older copies do not
# interfere.
_MODULES = tempfile.TemporaryDirectory(prefix="xlme-hf-modules-")
os.environ["HF_MODULES_CACHE"] = _MODULES.name
os.environ["HF_HUB_OFFLINE"] = "1"

import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (AutoModel, AutoModelForMaskedLM, AutoModelForPreTraining,  # noqa: E402
                          AutoModelForTokenClassification, AutoTokenizer, pipeline)

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
PADDING_WARNING = "We strongly recommend passing in an `attention_mask`"


class CheckFailed(Exception):
    pass


def require(condition, message):
    if not condition:
        raise CheckFailed(message)


def from_pretrained(auto, folder, new_keys=(), **kwargs):
    """auto.from_pretrained(folder): every parameter loaded but `new_keys`, nothing mismatched; in
    eval mode."""
    model, info = auto.from_pretrained(folder, trust_remote_code=True, output_loading_info=True,
                                       **kwargs)
    require(sorted(info["missing_keys"]) == sorted(new_keys),
            f"{auto.__name__}: missing {sorted(info['missing_keys'])}, not {sorted(new_keys)}")
    require(not info["mismatched_keys"] and not info["error_msgs"],
            f"{auto.__name__}: {info}")
    return model.eval()


def max_diff(got, want, real=None):
    diff = (got.detach().double() - want.double()).abs()
    return float(diff[real].max() if real is not None else diff.max())


def left_padded(ids, real, pad):
    """The rows of right-padded `ids` with their padding moved to the left."""
    out, mask = torch.full_like(ids, pad), torch.zeros_like(real)
    for row in range(ids.shape[0]):
        n = int(real[row].sum())
        out[row, ids.shape[1] - n:] = ids[row, :n]
        mask[row, ids.shape[1] - n:] = True
    return out, mask


def check_masked_lm(args, expected):
    """AutoModelForMaskedLM (the generator) and AutoModelForPreTraining (the discriminator with its
    replaced-token head) against the C++ model; the fill-mask pipeline."""
    ids, real = expected["input_ids"], ~expected["padding"]
    report = {}
    mlm = from_pretrained(AutoModelForMaskedLM, args.model)
    report["masked_lm_class"] = type(mlm).__name__
    with torch.no_grad():
        logits = mlm(input_ids=ids, attention_mask=real.long()).logits
    require(logits.shape == expected["gen_logits"].shape,
            f"masked-LM logits {list(logits.shape)}, the C++ generator's "
            f"{list(expected['gen_logits'].shape)}")
    report["generator_logits"] = max_diff(logits, expected["gen_logits"], real)
    require(report["generator_logits"] <= args.tolerance,
            f"masked-LM logits differ from the C++ generator's by {report['generator_logits']}")

    # The masked-LM baseline: its encoder and MLM head.
    base = from_pretrained(AutoModelForMaskedLM, args.mlm_model)
    with torch.no_grad():
        logits = base(input_ids=ids, attention_mask=real.long()).logits
    report["mlm_baseline_logits"] = max_diff(logits, expected["mlm_logits"], real)
    require(report["mlm_baseline_logits"] <= args.tolerance,
            f"the mlm baseline's logits differ from the C++ model's by "
            f"{report['mlm_baseline_logits']}")
    # An export without the generator says how to get one.
    try:
        AutoModelForMaskedLM.from_pretrained(args.xlmr_model, trust_remote_code=True)
        raise CheckFailed("AutoModelForMaskedLM loaded an export without the generator")
    except ValueError as e:
        require("--with-generator" in str(e), f"without the generator: {e}")

    rtd = from_pretrained(AutoModelForPreTraining, args.model)
    report["pre_training_class"] = type(rtd).__name__
    with torch.no_grad():
        out = rtd(input_ids=ids, attention_mask=real.long())
    report["rtd_logits"] = max_diff(out.logits, expected["rtd_logits"], real)
    require(report["rtd_logits"] <= args.tolerance,
            f"replaced-token logits differ from the C++ discriminator's by {report['rtd_logits']}")
    labels = (ids % 2).masked_fill(~real, 0)
    loss = rtd(input_ids=ids, attention_mask=real.long(), labels=labels).loss
    require(loss is not None and bool(torch.isfinite(loss)), f"pre-training loss {loss}")

    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    fill = pipeline("fill-mask", model=mlm, tokenizer=tokenizer, top_k=3)
    text = f"the quick {tokenizer.mask_token} fox"
    results = fill(text)
    encoded = tokenizer(text, return_tensors="pt")
    at = int((encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0])
    with torch.no_grad():
        want = mlm(**encoded).logits[0, at].topk(3).indices.tolist()
    report["fill_mask"] = [(r["token"], round(r["score"], 4)) for r in results]
    require([r["token"] for r in results] == want,
            f"fill-mask ranks {[r['token'] for r in results]}, the model's logits {want}")
    return report


def check_padding(args, expected):
    """Left against right padding, and the warning for pad ids without an attention_mask."""
    ids, real = expected["input_ids"], ~expected["padding"]
    pad = expected_special(args)["pad"]
    left_ids, left_real = left_padded(ids, real, pad)
    report = {}
    model = from_pretrained(AutoModel, args.model)
    with torch.no_grad():
        for name, load, pick in (("encoder", lambda: model, lambda o: o.last_hidden_state),
                                 ("masked_lm",
                                  lambda: from_pretrained(AutoModelForMaskedLM, args.model),
                                  lambda o: o.logits)):
            net = load()
            right = pick(net(input_ids=ids, attention_mask=real.long()))
            left = pick(net(input_ids=left_ids, attention_mask=left_real.long()))
            report[name] = max_diff(left[left_real], right[real])
            require(report[name] <= 1e-5,
                    f"{name}: left padding changes the outputs by {report[name]}")

    # transformers logs the warning once per message: cleared before each model's call.
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    transformers.logging.set_verbosity_warning()
    try:
        def warnings_of(net, **inputs):
            logging.Logger.warning_once.cache_clear()
            records.clear()
            with torch.no_grad():
                net(**inputs)
            return [m for m in records if PADDING_WARNING in m]

        ours = warnings_of(model, input_ids=ids)
        with_mask = warnings_of(model, input_ids=ids, attention_mask=real.long())
        # One of transformers' models that warn (DeBERTa; XLM-R's does not in transformers 5).
        reference = transformers.DebertaModel(transformers.DebertaConfig(
            vocab_size=int(ids.max()) + 1, hidden_size=8, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=8, pad_token_id=pad))
        theirs = warnings_of(reference.eval(), input_ids=ids)
    finally:
        transformers.logging.set_verbosity_error()
        library.removeHandler(handler)
    report["warning"] = ours[0] if ours else None
    require(theirs, "transformers' DeBERTa gave no padding warning: the check is broken")
    require(ours == theirs,
            f"pad ids without attention_mask: warned {ours}, DeBERTa warns {theirs}")
    require(not with_mask, f"warned with an attention_mask: {with_mask}")
    return report


def expected_special(args):
    with open(os.path.join(args.model, "config.json"), encoding="utf-8") as f:
        return json.load(f)["special_ids"]


def check_tokenizer(args, tokens):
    """The fast tokenizer: C++ ids in both layouts, word ids, offsets, pipeline spans."""
    report = {}
    for layout, folder in (("own", args.model), ("xlmr", args.xlmr_model)):
        fast = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        # The folder's Python tokenizer over sentencepiece (transformers 5 gives AutoTokenizer
        # callers the fast one whatever use_fast says).
        sys.path.insert(0, folder)
        try:
            import tokenization_xlme
            slow = tokenization_xlme.XlmeTokenizer.from_pretrained(folder)
        finally:
            sys.path.remove(folder)
            sys.modules.pop("tokenization_xlme", None)
        require(type(slow).__name__ == "XlmeTokenizer" and not slow.is_fast,
                f"{layout}: the folder's XlmeTokenizer gave {type(slow).__name__}")
        require(type(fast).__name__ == "XlmeTokenizerFast" and fast.is_fast,
                f"{layout}: AutoTokenizer gave {type(fast).__name__}, not XlmeTokenizerFast")
        require(len(fast) == len(slow),
                f"{layout}: {len(fast)} ids, the slow tokenizer {len(slow)}")
        bos, eos = fast.bos_token_id, fast.eos_token_id
        for text, cpp in zip(tokens[layout]["texts"], tokens[layout]["ids"]):
            got = fast(text)["input_ids"]
            require(got == [bos] + cpp + [eos],
                    f"{layout}: {text!r} -> {got}, the C++ tokenizer's {[bos] + cpp + [eos]}")
        (a, b), (a_ids, b_ids) = tokens[layout]["texts"][:2], tokens[layout]["ids"][:2]
        require(fast(a, b)["input_ids"] == [bos] + a_ids + [eos, eos] + b_ids + [eos],
                f"{layout}: the pair is not <s> a </s></s> b </s>")
        report[layout] = len(tokens[layout]["texts"])

    fast = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    text = "the quick brown fox"
    encoded = fast(text, return_offsets_mapping=True)
    require("offset_mapping" in encoded, "return_offsets_mapping gave no offset_mapping")
    words = encoded.word_ids()
    require(words[0] is None and words[-1] is None and
            sorted(set(w for w in words if w is not None)) == [0, 1, 2, 3],
            f"word_ids {words} for 4 words")
    pieces = fast.convert_ids_to_tokens(encoded["input_ids"])
    for piece, (start, end) in list(zip(pieces, encoded["offset_mapping"]))[1:-1]:
        if piece == "\u2581":  # the dummy prefix or a space alone: no characters of its own
            continue
        require(text[start:end].strip() == piece.replace("\u2581", ""),
                f"offsets ({start}, {end}) of {piece!r} are {text[start:end]!r}")
    report["offsets"] = encoded["offset_mapping"]
    split = fast(text.split(), is_split_into_words=True).word_ids()
    require(split == words, f"is_split_into_words word_ids {split}, not {words}")

    model = from_pretrained(AutoModelForTokenClassification, args.model,
                            ["head.output.weight", "head.output.bias"], num_labels=3)
    tagger = pipeline("token-classification", model=model, tokenizer=fast)
    entities = tagger(text)
    require(entities and all(isinstance(e["start"], int) and isinstance(e["end"], int)
                             and 0 <= e["start"] <= e["end"] <= len(text) for e in entities),
            f"token-classification entities without spans: {entities}")
    for e in entities:
        require(e["word"] == "\u2581" or
                text[e["start"]:e["end"]].strip() == e["word"].lstrip("\u2581"),
                f"token-classification span {e} is {text[e['start']:e['end']]!r}")
    report["pipeline_spans"] = [(e["start"], e["end"]) for e in entities]
    return report


def check_trainer(args):
    """transformers' Trainer on the token head: a few steps, save_model, from_pretrained, the same
    predictions."""
    from transformers import DataCollatorForTokenClassification, Trainer, TrainingArguments

    with tempfile.TemporaryDirectory() as out:
        return train_save_reload(args, out, Trainer, TrainingArguments(
            output_dir=out, max_steps=6, per_device_train_batch_size=4, learning_rate=1e-3,
            use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
            seed=5), DataCollatorForTokenClassification)


def train_save_reload(args, out, Trainer, training, DataCollatorForTokenClassification):
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    sentences = [["the", "quick", "brown", "fox"], ["a", "lazy", "dog"], ["jumps", "over", "it"],
                 ["one", "two", "three", "four", "five"]] * 4
    data = []
    for words in sentences:
        encoded = tokenizer(words, is_split_into_words=True)
        # The HF recipe: each word's label on its first piece, -100 elsewhere.
        previous, labels = None, []
        for w in encoded.word_ids():
            labels.append(-100 if w is None or w == previous else len(words[w]) % 3)
            previous = w
        data.append({**encoded, "labels": labels})
    model = from_pretrained(AutoModelForTokenClassification, args.model,
                            ["head.output.weight", "head.output.bias"], num_labels=3)
    before = model.head.output.weight.detach().clone()
    trainer = Trainer(model=model, args=training, train_dataset=data,
                      data_collator=DataCollatorForTokenClassification(tokenizer))
    trainer.remove_callback(transformers.PrinterCallback)  # stdout carries the JSON report
    result = trainer.train()
    trainer.save_model(os.path.join(out, "final"))
    tokenizer.save_pretrained(os.path.join(out, "final"))
    require(not torch.equal(before, model.head.output.weight.detach()),
            "the Trainer did not change the head")
    batch = tokenizer([" ".join(s) for s in sentences[:4]], padding=True, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        want = model(**batch).logits
    again = from_pretrained(AutoModelForTokenClassification, os.path.join(out, "final"))
    reloaded = AutoTokenizer.from_pretrained(os.path.join(out, "final"), trust_remote_code=True)
    require(reloaded(" ".join(sentences[0]))["input_ids"] ==
            tokenizer(" ".join(sentences[0]))["input_ids"], "the saved tokenizer gives other ids")
    with torch.no_grad():
        got = again(**batch).logits
    require(torch.equal(got, want),
            f"predictions differ after save and reload by {max_diff(got, want)}")
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return {"steps": result.global_step, "losses": [round(x, 4) for x in losses]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--xlmr-model", required=True)
    parser.add_argument("--mlm-model", required=True)
    parser.add_argument("--expected", required=True)
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    expected = safetensors.torch.load_file(args.expected)
    with open(args.tokens, encoding="utf-8") as f:
        tokens = json.load(f)

    report = {"transformers": transformers.__version__}
    checks = {"masked_lm": lambda: check_masked_lm(args, expected),
              "padding": lambda: check_padding(args, expected),
              "tokenizer": lambda: check_tokenizer(args, tokens),
              "trainer": lambda: check_trainer(args)}
    for name, check in checks.items():
        try:
            report[name] = {"ok": True, **check()}
        except CheckFailed as e:
            report[name] = {"ok": False, "error": str(e)}
        except Exception as e:  # noqa: BLE001: reported as this check's failure
            report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc(limit=-3)}
    print(json.dumps(report, default=str))
    sys.exit(0 if all(report[name]["ok"] for name in checks) else 1)


if __name__ == "__main__":
    main()
