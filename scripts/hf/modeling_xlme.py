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
XlmeForMaskedLM is the generator with its head (generator.*, generator_head.*; with
`xlme-export --with-generator`), or the masked-LM baselines' encoder with theirs (mlm_head.*);
XlmeForPreTraining is the discriminator with its replaced-token head (discriminator_head.*).
Position ids default to 0..T-1 less each row's leading padding (from the attention mask), so that
left and right padding give the same outputs, as xlme's C++ model::default_positions; pad ids
without an attention_mask get transformers' warning.
token_type_ids are accepted for the Trainer's sake and ignored (xlme has no segment embeddings).
Written for transformers 5.
"""
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (BaseModelOutput, MaskedLMOutput,
                                           QuestionAnsweringModelOutput, SequenceClassifierOutput,
                                           TokenClassifierOutput)
from transformers.models.electra.modeling_electra import ElectraForPreTrainingOutput

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


def encoder_shape(config, name="discriminator"):
    """The sizes of the encoder `name` (discriminator or generator): config.json's generator
    section gives the generator's, the discriminator's where it holds 0 (as xlme-export writes
    it, resolved)."""
    if name == "discriminator":
        return config
    g = config.generator
    return SimpleNamespace(hidden_size=g.get("hidden_size") or config.hidden_size,
                           heads=g.get("heads") or config.heads,
                           ffn_size=g.get("ffn_size") or config.ffn_size, layers=g["layers"],
                           layer_norm_eps=config.layer_norm_eps,
                           relative_position=config.relative_position,
                           share_layers=getattr(config, "share_layers", "none"))


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
    """discriminator.* (or generator.*): everything of the encoder but the shared embedding
    tables."""

    def __init__(self, config, name="discriminator"):
        super().__init__()
        shape = encoder_shape(config, name)
        e, rp = config.embedding_size, config.relative_position
        self.embedding_norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        if e != shape.hidden_size:
            self.embedding_projection = nn.Linear(e, shape.hidden_size)
        # The discriminator's own deltas (DeBERTa-v3); the generator trains the shared tables.
        if config.embedding_sharing == "gdes" and name == "discriminator":
            self.token_delta = nn.Parameter(torch.empty(config.vocab_size, e))
            if config.absolute_positions:
                self.position_delta = nn.Parameter(torch.empty(config.max_positions, e))
        if rp["enabled"] and rp["shared_across_layers"]:
            self.relative_bias = nn.Parameter(torch.empty(shape.heads, rp["num_buckets"]))
        distinct = 1 if getattr(config, "share_layers", "none") == "all" else shape.layers
        self.layers = nn.ModuleList(XlmeLayer(shape, i == 0) for i in range(distinct))
        if config.norm == "pre":
            self.final_norm = nn.LayerNorm(shape.hidden_size, eps=config.layer_norm_eps)


def run_encoder(model, name, input_ids, attention_mask, position_ids):
    """xlme_reference.Encoder.forward of the encoder `name` on `model`'s parameters (names as in
    model.safetensors), in `model`'s train/eval mode: [embeddings, layer 1, ..., layer L].
    Without position_ids, the positions follow the attention mask (xlme_reference's
    default_positions: a left-padded row counts from its first real token)."""
    encoder = Encoder(model.config.to_dict(), dict(model.named_parameters()), name)
    encoder.training = model.training
    padding = None if attention_mask is None else attention_mask == 0
    return encoder.forward(input_ids, position_ids, padding)


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
            elif name in ("token_delta", "position_delta", "output_bias"):
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
        self.warn_if_padding_and_no_attention_mask(input_ids, attention_mask)
        states = run_encoder(self, "discriminator", input_ids, attention_mask, position_ids)
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


class XlmeMaskedLmHead(nn.Module):
    """generator_head.* / mlm_head.*: dense [hidden -> embedding] -> GELU -> LayerNorm -> the
    token table (tied: embeddings.token) + output_bias [vocab], as xlme's GeneratorHead."""

    def __init__(self, hidden_size, config):
        super().__init__()
        self.dense = nn.Linear(hidden_size, config.embedding_size)
        self.norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))


class XlmeForMaskedLM(XlmePreTrainedModel):
    """The masked-LM head of the export: ELECTRA's generator with its head (generator.*,
    generator_head.*: exported with `xlme-export --with-generator`), or, for the masked-LM
    baselines (objectives.set mlm, mlm+tlm), the encoder with its MLM head (mlm_head.*).
    logits: [B, T, vocab]; labels: [B, T], -100 where ignored."""

    _keys_to_ignore_on_load_unexpected = [r"^discriminator", r"^generator", r"^mlm_head\."]

    def __init__(self, config):
        super().__init__(config)
        if getattr(config, "architecture", "electra") == "masked-lm":
            self.encoder_name, head_name = "discriminator", "mlm_head"
        elif (getattr(config, "architecture", "electra") == "electra"
              and (getattr(config, "generator", None) or {}).get("exported")):
            self.encoder_name, head_name = "generator", "generator_head"
        else:
            raise ValueError(
                "XlmeForMaskedLM: this export holds no masked-LM head (config.json: architecture "
                f"'{getattr(config, 'architecture', None)}', generator.exported false); export "
                "the checkpoint again with `xlme-export --with-generator`")
        self.head_name = head_name
        self.embeddings = XlmeEmbeddings(config)
        self.add_module(self.encoder_name, XlmeEncoderWeights(config, self.encoder_name))
        hidden = encoder_shape(config, self.encoder_name).hidden_size
        self.add_module(head_name, XlmeMaskedLmHead(hidden, config))
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.token

    def set_input_embeddings(self, value):
        self.embeddings.token = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, output_hidden_states=None, return_dict=None):
        if input_ids is None:
            raise ValueError("XlmeForMaskedLM needs input_ids (inputs_embeds is not supported)")
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        self.warn_if_padding_and_no_attention_mask(input_ids, attention_mask)
        states = run_encoder(self, self.encoder_name, input_ids, attention_mask, position_ids)
        head = getattr(self, self.head_name)
        x = states[-1].to(head.dense.weight.dtype)
        x = head.norm(F.gelu(head.dense(x)))
        table = self.embeddings.token.weight.to(x.dtype)  # tied: [V, embedding]
        logits = F.linear(x, table, head.output_bias)  # [B, T, V]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), labels.view(-1),
                                   ignore_index=-100)
        hidden_states = tuple(states) if output_hidden_states else None
        if not return_dict:
            return tuple(v for v in (loss, logits, hidden_states) if v is not None)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=hidden_states)


class XlmeForPreTraining(XlmePreTrainedModel):
    """The discriminator with its replaced-token-detection head (discriminator_head.*: dense,
    GELU, one logit per token), as ElectraForPreTraining. logits: [B, T], > 0 for "replaced";
    labels: [B, T], 1 where replaced, 0 where original (the loss counts the real tokens)."""

    def __init__(self, config):
        super().__init__(config)
        if not getattr(config, "rtd_head", True):
            raise ValueError(
                "XlmeForPreTraining: this export has no replaced-token head (config.json: "
                f"rtd_head false, objectives.set '{getattr(config, 'objective_set', None)}'); "
                "only ELECTRA-style pre-training (objectives.set xlme, xlme-mono) trains one")
        self.xlme = XlmeModel(config)
        self.discriminator_head = nn.Module()
        self.discriminator_head.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.discriminator_head.output = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, output_hidden_states=None, return_dict=None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.xlme(input_ids, attention_mask, position_ids=position_ids,
                        output_hidden_states=output_hidden_states, return_dict=True)
        h = self.discriminator_head
        hidden = out.last_hidden_state.to(h.output.weight.dtype)
        logits = h.output(F.gelu(h.dense(hidden))).squeeze(-1)  # [B, T]
        loss = None
        if labels is not None:
            real = (torch.ones_like(labels, dtype=torch.bool) if attention_mask is None
                    else attention_mask.bool())
            loss = F.binary_cross_entropy_with_logits(logits[real].float(),
                                                      labels[real].float())
        if not return_dict:
            return tuple(v for v in (loss, logits, out.hidden_states) if v is not None)
        return ElectraForPreTrainingOutput(loss=loss, logits=logits,
                                           hidden_states=out.hidden_states)
