"""`transformers` models of an xlme export (xlme-export copies this file, configuration_xlme.py
and xlme_reference.py into the export folder; config.json's auto_map names the classes):

    from transformers import AutoModel, AutoTokenizer
    model = AutoModel.from_pretrained(DIR, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)
    out = model(**tokenizer(["Hello world"], return_tensors="pt"), output_hidden_states=True)

The modules below only hold the parameters, under the names of the export's model.safetensors
(embeddings.*, discriminator.*), so that from_pretrained loads the file as it is; the computation
is xlme_reference.Encoder.forward, the same code that checks the C++ encoder (no second copy of
the math), in float32 whatever the parameters' dtype (a bf16 export's weights are widened, as
xlme's C++ loader widens them). The heads are xlme-finetune's, under its names (head.*): a folder
with the fine-tuned weights of xlme's FinetuneModel loads into them as it is.
XlmeForSequenceClassification is XLM-R's head on <s> (dropout, dense, tanh, dropout, output), the
token and question-answering heads are dropout and one linear map; they run in their own dtype.
Position ids default to 0..T-1, as xlme's; token_type_ids are accepted for the Trainer's sake and
ignored (xlme has no segment embeddings). Written for transformers 5.
"""
import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (BaseModelOutput, QuestionAnsweringModelOutput,
                                           SequenceClassifierOutput, TokenClassifierOutput)

from .configuration_xlme import XlmeConfig
from .xlme_reference import Encoder


class XlmeEmbeddings(nn.Module):
    """embeddings.*: the token table (shared with the generator in pre-training) and the
    absolute positions."""

    def __init__(self, config):
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.embedding_size)
        if config.absolute_positions:
            self.position = nn.Embedding(config.max_positions, config.embedding_size)


class XlmeFeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.intermediate = nn.Linear(config.hidden_size, config.ffn_size)
        self.output = nn.Linear(config.ffn_size, config.hidden_size)


class XlmeAttention(nn.Module):
    """discriminator.layers.<i>.attention.*: projections, the layer's own bias table d [H, buckets]
    and the gate's u, v [H, d_k] and w [H]."""

    def __init__(self, config):
        super().__init__()
        h, rp = config.hidden_size, config.relative_position
        for name in ("query", "key", "value", "output"):
            self.add_module(name, nn.Linear(h, h))
        if rp["enabled"] and not rp["shared_across_layers"]:
            self.relative_bias = nn.Parameter(torch.empty(config.heads, rp["num_buckets"]))
        if rp["enabled"] and rp["gated"]:
            self.gate_u = nn.Parameter(torch.empty(config.heads, h // config.heads))
            self.gate_v = nn.Parameter(torch.empty(config.heads, h // config.heads))
            self.gate_w = nn.Parameter(torch.empty(config.heads))


class XlmeLayer(nn.Module):
    """discriminator.layers.<i>.*; with ALBERT's layer sharing (share_layers), layers above the
    first hold no weights of a shared sub-layer: layers.0's serve every depth."""

    def __init__(self, config, first=True):
        super().__init__()
        share = getattr(config, "share_layers", "none")
        if first or share not in ("all", "attention"):
            self.attention = XlmeAttention(config)
            self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if first or share not in ("all", "ffn"):
            self.ffn = XlmeFeedForward(config)
            self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class XlmeEncoderWeights(nn.Module):
    """discriminator.*: everything of the encoder but the shared embedding tables."""

    def __init__(self, config):
        super().__init__()
        e, rp = config.embedding_size, config.relative_position
        self.embedding_norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        if e != config.hidden_size:
            self.embedding_projection = nn.Linear(e, config.hidden_size)
        if config.embedding_sharing == "gdes":  # the discriminator's own deltas (DeBERTa-v3)
            self.token_delta = nn.Parameter(torch.empty(config.vocab_size, e))
            if config.absolute_positions:
                self.position_delta = nn.Parameter(torch.empty(config.max_positions, e))
        if rp["enabled"] and rp["shared_across_layers"]:
            self.relative_bias = nn.Parameter(torch.empty(config.heads, rp["num_buckets"]))
        distinct = 1 if getattr(config, "share_layers", "none") == "all" else config.layers
        self.layers = nn.ModuleList(XlmeLayer(config, i == 0) for i in range(distinct))
        if config.norm == "pre":
            self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class XlmePreTrainedModel(PreTrainedModel):
    config_class = XlmeConfig
    base_model_prefix = "xlme"
    # Pre-training's heads and the generator, in the export beside the encoder.
    _keys_to_ignore_on_load_unexpected = [r"^discriminator_head\.", r"^generator",
                                          r"^mlm_head\."]

    def _init_weights(self, module):
        """xlme's initialization: N(0, init_std) weights, zero biases and deltas, unit LayerNorm
        and gate w. Only for what from_pretrained did not load (a new head): `init`'s functions
        leave a loaded tensor as it is."""
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, 0.0, std)
            if isinstance(module, nn.Linear):
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        for name, parameter in module.named_parameters(recurse=False):
            if name in ("relative_bias", "gate_u", "gate_v"):
                init.normal_(parameter, 0.0, std)
            elif name == "gate_w":
                init.ones_(parameter)
            elif name in ("token_delta", "position_delta"):
                init.zeros_(parameter)


class XlmeModel(XlmePreTrainedModel):
    """The discriminator encoder. forward returns BaseModelOutput: last_hidden_state [B, T, hidden]
    and, with output_hidden_states, (embeddings, layer 1, ..., layer L) as xlme counts them."""

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = XlmeEmbeddings(config)
        self.discriminator = XlmeEncoderWeights(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.token

    def set_input_embeddings(self, value):
        self.embeddings.token = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                output_hidden_states=None, return_dict=None):
        if input_ids is None:
            raise ValueError("XlmeModel needs input_ids (inputs_embeds is not supported)")
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        encoder = Encoder(self.config.to_dict(), dict(self.named_parameters()), "discriminator")
        encoder.training = self.training
        padding = None if attention_mask is None else attention_mask == 0
        states = encoder.forward(input_ids, position_ids, padding)
        hidden_states = tuple(states) if output_hidden_states else None
        if not return_dict:
            return tuple(v for v in (states[-1], hidden_states) if v is not None)
        return BaseModelOutput(last_hidden_state=states[-1], hidden_states=hidden_states)


class XlmeForSequenceClassification(XlmePreTrainedModel):
    """XLM-R's head on <s> (xlme-finetune's ClassificationHead). labels: [B] class ids, or [B]
    floats for num_labels == 1 (regression)."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.xlme = XlmeModel(config)
        self.head = nn.Module()
        self.head.dropout = nn.Dropout(config.classifier_dropout)
        self.head.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.head.output = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, output_hidden_states=None, return_dict=None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.xlme(input_ids, attention_mask, position_ids=position_ids,
                        output_hidden_states=output_hidden_states, return_dict=True)
        h = self.head
        first = out.last_hidden_state[:, 0].to(h.output.weight.dtype)  # [B, hidden]: <s>
        logits = h.output(h.dropout(torch.tanh(h.dense(h.dropout(first)))))  # [B, labels]
        loss = None
        if labels is not None:
            loss = (F.mse_loss(logits.squeeze(-1), labels.float()) if self.num_labels == 1
                    else F.cross_entropy(logits, labels.view(-1)))
        if not return_dict:
            return tuple(v for v in (loss, logits, out.hidden_states) if v is not None)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class XlmeForTokenClassification(XlmePreTrainedModel):
    """One label per token (xlme-finetune's TokenHead). labels: [B, T], -100 where ignored."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.xlme = XlmeModel(config)
        self.head = nn.Module()
        self.head.dropout = nn.Dropout(config.classifier_dropout)
        self.head.output = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, output_hidden_states=None, return_dict=None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.xlme(input_ids, attention_mask, position_ids=position_ids,
                        output_hidden_states=output_hidden_states, return_dict=True)
        hidden = out.last_hidden_state.to(self.head.output.weight.dtype)
        logits = self.head.output(self.head.dropout(hidden))  # [B, T, labels]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1),
                                   ignore_index=-100)
        if not return_dict:
            return tuple(v for v in (loss, logits, out.hidden_states) if v is not None)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class XlmeForQuestionAnswering(XlmePreTrainedModel):
    """Extractive QA: start and end logits per token (xlme-finetune's TokenHead with 2 outputs).
    start_positions, end_positions: [B]; positions outside the sequence are ignored."""

    def __init__(self, config):
        super().__init__(config)
        self.xlme = XlmeModel(config)
        self.head = nn.Module()
        self.head.dropout = nn.Dropout(config.classifier_dropout)
        self.head.output = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                start_positions=None, end_positions=None, output_hidden_states=None,
                return_dict=None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.xlme(input_ids, attention_mask, position_ids=position_ids,
                        output_hidden_states=output_hidden_states, return_dict=True)
        hidden = out.last_hidden_state.to(self.head.output.weight.dtype)
        logits = self.head.output(self.head.dropout(hidden))  # [B, T, 2]
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            length = start_logits.size(1)
            start = start_positions.view(-1).clamp(0, length)
            end = end_positions.view(-1).clamp(0, length)
            loss = (F.cross_entropy(start_logits, start, ignore_index=length)
                    + F.cross_entropy(end_logits, end, ignore_index=length)) / 2
        if not return_dict:
            return tuple(v for v in (loss, start_logits, end_logits, out.hidden_states)
                         if v is not None)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits,
                                            end_logits=end_logits, hidden_states=out.hidden_states)
