"""The `transformers` tokenizer of an xlme export: the export's spm.model run by the
`sentencepiece` library (as xlme's C++ tokenizer runs it), its pieces mapped onto the ids the model
was trained with (xlme-export copies this file; tokenizer_config.json's auto_map names the class).
Both of xlme's vocabulary layouts put <s>=0, <pad>=1, </s>=2, <unk>=3 first and <mask> last
(include/xlme/data/tokenizer.h):
  xlmr: XLM-R's own model (<unk>=0, <s>=1, </s>=2 in SentencePiece): piece i >= 3 -> i + 1, as
        fairseq's dictionary (XLM-R) maps it;
  own:  models trained by xlme-data train-spm already hold <s>, <pad>, </s>, <unk> as pieces
        0..3: piece i -> i, <mask> = the piece count.
Sequences are framed as XLM-R's: <s> a </s>, and <s> a </s></s> b </s> for a pair (as
xlme-finetune frames them). Needs the `sentencepiece` Python module.
XlmeTokenizerFast (what AutoTokenizer gives by default) reads tokenizer.json instead, which
xlme-export builds from the same spm.model as transformers' SpmConverter builds XLM-R's (ids in the
export's vocab_layout): the same ids, plus word_ids() and return_offsets_mapping.
"""
import os
import shutil
import zlib

import sentencepiece
from transformers import PreTrainedTokenizer, PreTrainedTokenizerFast

SPIECE_UNDERLINE = "\u2581"


def check_spm_model(vocab_file, spm_model_crc32):
    """xlme-export records the CRC32 of the spm.model it wrote (tokenizer.json is built from it):
    another model in its place is refused."""
    if not spm_model_crc32 or not vocab_file or not os.path.isfile(vocab_file):
        return
    with open(vocab_file, "rb") as f:
        found = f"{zlib.crc32(f.read()):08x}"
    if found != spm_model_crc32:
        raise ValueError(f"{vocab_file} (CRC32 {found}) is not the SentencePiece model "
                         f"this export was made with (tokenizer_config.json records CRC32 "
                         f"{spm_model_crc32}); its ids would mean other pieces. Put the "
                         "export's own spm.model back, or export the checkpoint again")


class XlmeTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "spm.model"}
    model_input_names = ["input_ids", "attention_mask"]  # xlme has no segment embeddings

    def __init__(self, vocab_file, vocab_layout="xlmr", bos_token="<s>", pad_token="<pad>",
                 eos_token="</s>", unk_token="<unk>", mask_token="<mask>", cls_token="<s>",
                 sep_token="</s>", spm_model_crc32=None, **kwargs):
        if vocab_layout not in ("xlmr", "own"):
            raise ValueError(f"XlmeTokenizer: vocab_layout is '{vocab_layout}', not xlmr or own "
                             "(tokenizer_config.json)")
        check_spm_model(vocab_file, spm_model_crc32)
        self.vocab_file = vocab_file
        self.vocab_layout = vocab_layout
        self.sp_model = sentencepiece.SentencePieceProcessor(model_file=vocab_file)
        pieces = self.sp_model.get_piece_size()
        expected = ["<s>", "<pad>", "</s>", "<unk>"] if vocab_layout == "own" else ["<unk>", "<s>",
                                                                                   "</s>"]
        found = [self.sp_model.IdToPiece(i) for i in range(min(pieces, len(expected)))]
        if pieces <= len(expected) or found != expected:
            raise ValueError(f"{vocab_file}: SentencePiece pieces 0..{len(expected) - 1} are "
                             f"{found}, not {expected} as the '{vocab_layout}' layout has "
                             "(tokenizer_config.json's vocab_layout)")
        # xlmr: every piece moves up by one to make room for <pad>=1.
        self.offset = 1 if vocab_layout == "xlmr" else 0
        self.special_ids = {str(bos_token): 0, str(pad_token): 1, str(eos_token): 2,
                            str(unk_token): 3, str(mask_token): pieces + self.offset}
        self.special_tokens = {i: token for token, i in self.special_ids.items()}
        super().__init__(vocab_layout=vocab_layout, spm_model_crc32=spm_model_crc32,
                         bos_token=bos_token, pad_token=pad_token,
                         eos_token=eos_token, unk_token=unk_token, mask_token=mask_token,
                         cls_token=cls_token, sep_token=sep_token,
                         special_tokens_pattern="cls_double_sep", **kwargs)

    @property
    def vocab_size(self):
        return self.sp_model.get_piece_size() + self.offset + 1  # <mask> included

    def get_vocab(self):
        return {self._convert_id_to_token(i): i for i in range(self.vocab_size)}

    def _tokenize(self, text):
        return self.sp_model.encode(text, out_type=str)

    def _convert_token_to_id(self, token):
        if token in self.special_ids:
            return self.special_ids[token]
        piece = self.sp_model.PieceToId(token)
        return self.special_ids[str(self.unk_token)] if piece == self.sp_model.unk_id() \
            else piece + self.offset

    def _convert_id_to_token(self, index):
        if index in self.special_tokens:
            return self.special_tokens[index]
        return self.sp_model.IdToPiece(index - self.offset)

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens).replace(SPIECE_UNDERLINE, " ").strip()

    def save_vocabulary(self, save_directory, filename_prefix=None):
        out = os.path.join(save_directory,
                           (filename_prefix + "-" if filename_prefix else "") + "spm.model")
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, out)
        return (out,)


class XlmeTokenizerFast(PreTrainedTokenizerFast):
    """The export's tokenizer.json run by the `tokenizers` library: XlmeTokenizer's ids and
    framing, with offsets and word ids (the token-classification pipeline's spans)."""

    vocab_files_names = {"vocab_file": "spm.model", "tokenizer_file": "tokenizer.json"}
    model_input_names = ["input_ids", "attention_mask"]
    slow_tokenizer_class = XlmeTokenizer

    @classmethod
    def convert_to_native_format(cls, trust_remote_code=False, **kwargs):
        """tokenizer.json is loaded as it is (transformers would otherwise take it apart for a class
        with its own __init__)."""
        return kwargs

    def __init__(self, vocab_file=None, tokenizer_file=None, vocab_layout="xlmr",
                 bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                 mask_token="<mask>", cls_token="<s>", sep_token="</s>", spm_model_crc32=None,
                 **kwargs):
        if not tokenizer_file or not os.path.isfile(tokenizer_file):
            raise ValueError(f"XlmeTokenizerFast needs the export's tokenizer.json (found "
                             f"{tokenizer_file!r}); export the checkpoint again with this xlme, "
                             "or use the folder's Python tokenizer, "
                             "tokenization_xlme.XlmeTokenizer.from_pretrained(folder)")
        check_spm_model(vocab_file, spm_model_crc32)
        self.vocab_file = vocab_file
        super().__init__(vocab_file=vocab_file, tokenizer_file=tokenizer_file,
                         vocab_layout=vocab_layout, spm_model_crc32=spm_model_crc32,
                         bos_token=bos_token, pad_token=pad_token, eos_token=eos_token,
                         unk_token=unk_token, mask_token=mask_token, cls_token=cls_token,
                         sep_token=sep_token, **kwargs)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        """spm.model beside the tokenizer.json save_pretrained writes (the slow tokenizer and
        xlme's C++ loader read it)."""
        if not self.vocab_file or not os.path.isfile(self.vocab_file):
            return ()
        out = os.path.join(save_directory,
                           (filename_prefix + "-" if filename_prefix else "") + "spm.model")
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, out)
        return (out,)
