"""The `transformers` configuration of an xlme export (xlme-export copies this file into the
export folder; config.json's auto_map names it). Every field of the export's config.json becomes
an attribute under its xlme name (hidden_size, layers, heads, relative_position, ...), so that
xlme_reference.Encoder reads the same dictionary as from the export itself; attribute_map gives
the usual `transformers` names (num_hidden_layers, num_attention_heads, ...) on top.
Defaults are xlme's model.* defaults (a 768-wide, 12-layer, XLM-R-vocabulary encoder).
"""
from transformers import PreTrainedConfig


class XlmeConfig(PreTrainedConfig):
    model_type = "xlme"
    attribute_map = {
        "num_hidden_layers": "layers",
        "num_attention_heads": "heads",
        "intermediate_size": "ffn_size",
        "max_position_embeddings": "max_positions",
        "hidden_dropout_prob": "dropout",
        "attention_probs_dropout_prob": "attention_dropout",
        "initializer_range": "init_std",
    }

    def __init__(self, vocab_size=250002, hidden_size=768, layers=12, heads=12, ffn_size=3072,
                 embedding_size=None, embedding_sharing="full", share_layers="none",
                 max_positions=512,
                 absolute_positions=True, norm="post", layer_norm_eps=1e-5,
                 relative_position=None, dropout=0.1, attention_dropout=0.1, init_std=0.02,
                 special_ids=None, vocab_layout="xlmr", classifier_dropout=None, **kwargs):
        if norm not in ("post", "pre"):
            raise ValueError(f"XlmeConfig: norm is '{norm}', not post or pre")
        if share_layers not in ("none", "all", "attention", "ffn"):
            raise ValueError(f"XlmeConfig: share_layers is '{share_layers}', not none, all, "
                             "attention or ffn")
        if hidden_size % heads != 0:
            raise ValueError(f"XlmeConfig: hidden_size {hidden_size} is not a multiple of "
                             f"heads {heads}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.layers = layers
        self.heads = heads
        self.ffn_size = ffn_size
        self.embedding_size = embedding_size or hidden_size
        self.embedding_sharing = embedding_sharing
        self.share_layers = share_layers
        self.max_positions = max_positions
        self.absolute_positions = absolute_positions
        self.norm = norm
        self.layer_norm_eps = layer_norm_eps
        self.relative_position = {"enabled": True, "gated": True, "shared_across_layers": False,
                                  "num_buckets": 32, "max_distance": 128,
                                  **(relative_position or {})}
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.init_std = init_std
        # XLM-R's id layout: <s>=0, <pad>=1, </s>=2, <unk>=3, <mask> last.
        self.special_ids = special_ids or {"bos": 0, "pad": 1, "eos": 2, "unk": 3,
                                           "mask": vocab_size - 1}
        self.vocab_layout = vocab_layout
        # The heads' dropout (as xlme-finetune's heads: the encoder's dropout unless given).
        self.classifier_dropout = dropout if classifier_dropout is None else classifier_dropout
        for key, name in (("bos_token_id", "bos"), ("pad_token_id", "pad"),
                          ("eos_token_id", "eos")):
            kwargs.setdefault(key, self.special_ids[name])
        super().__init__(**kwargs)
