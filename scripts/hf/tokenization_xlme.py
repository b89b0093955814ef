"""The `transformers` tokenizer of an xlme export: XLM-R's SentencePiece tokenizer over the
export's spm.model, giving the ids the model was trained with (xlme-export copies this file;
tokenizer_config.json's auto_map names the class). Both of xlme's vocabulary layouts put
<s>=0, <pad>=1, </s>=2, <unk>=3 first and <mask> last (include/xlme/data/tokenizer.h):
  xlmr: XLM-R's own model (<unk>=0, <s>=1, </s>=2 in SentencePiece): piece i -> i + 1, as
        XLMRobertaTokenizer does;
  own:  models trained by xlme-data train-spm already hold <s>, <pad>, </s>, <unk> as pieces
        0..3: piece i -> i, <mask> = the piece count.
Needs the `sentencepiece` Python module (Debian: python3-sentencepiece).
"""
from transformers import XLMRobertaTokenizer


class XlmeTokenizer(XLMRobertaTokenizer):
    vocab_files_names = {"vocab_file": "spm.model"}
    pretrained_vocab_files_map = {}
    max_model_input_sizes = {}

    def __init__(self, vocab_file, vocab_layout="xlmr", **kwargs):
        if vocab_layout not in ("xlmr", "own"):
            raise ValueError(f"XlmeTokenizer: vocab_layout is '{vocab_layout}', not xlmr or own "
                             "(tokenizer_config.json)")
        super().__init__(vocab_file, vocab_layout=vocab_layout, **kwargs)
        self.vocab_layout = vocab_layout
        expected = ["<s>", "<pad>", "</s>", "<unk>"] if vocab_layout == "own" else ["<unk>", "<s>",
                                                                                   "</s>"]
        pieces = [self.sp_model.IdToPiece(i) for i in range(len(expected))]
        if pieces != expected:
            raise ValueError(f"{vocab_file}: SentencePiece pieces 0..{len(expected) - 1} are "
                             f"{pieces}, not {expected} as the '{vocab_layout}' layout has "
                             "(tokenizer_config.json's vocab_layout)")
        if str(self._mask_token) != "<mask>":
            # transformers without the `tokenizers` package: its stand-in AddedToken has no
            # __str__, so that mask_token would be the token's repr (and mask_token_id <unk>).
            class MaskToken(type(self._mask_token)):
                def __str__(self):
                    return self.content

            self._mask_token = MaskToken(**vars(self._mask_token))
        if vocab_layout == "own":
            self.fairseq_offset = 0
            self.fairseq_tokens_to_ids["<mask>"] = len(self.sp_model)
            self.fairseq_ids_to_tokens = {v: k for k, v in self.fairseq_tokens_to_ids.items()}
