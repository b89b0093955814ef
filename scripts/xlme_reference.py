#!/usr/bin/env python3
"""A pure PyTorch reference for xlme's encoder: loads an xlme-export folder and computes every
layer's hidden states, as the C++ model does (docs/ARCHITECTURE.md#model). Needs only torch and numpy;
copy this file to use an exported model anywhere.

    scripts/xlme_reference.py --model DIR --ids "0 17 42 2" [--ids "0 5 2"]
    scripts/xlme_reference.py --model DIR --inputs IN.safetensors --out OUT.safetensors
    scripts/xlme_reference.py --model DIR --inputs IN.safetensors --compare EXPECTED.safetensors

In Python:

    import torch, xlme_reference
    model = xlme_reference.load_model("DIR")
    states = model.hidden_states(torch.tensor([[0, 17, 42, 2]]))  # [embeddings, layer 1, ...]

The model (config.json names every switch):
  x_0 = LN_emb(E_tok[ids] (+ E_pos[positions])) (-> projection when the embeddings are narrower)
  post-LN layer: h = LN_a(x + Attn(x)),        x' = LN_f(h + FFN(h))
  pre-LN layer:  h = x + Attn(LN_a(x)),        x' = h + FFN(LN_f(h)); the last output gets LN_final
  Attn: a_ij ~ exp(q_i.k_j / sqrt(d_k) + r_ij), r_ij = d_{h, b(i-j)} * gate_i (gated) or d (plain)
  gate_i = 1 + g_u + (1 - g_u) * w_h * g_r, g_u = sigmoid(q_i.u_h), g_r = sigmoid(q_i.v_h)
  FFN: GELU (erf) between two linear maps. Padded keys get no attention.
  Dropout (config.json's dropout, attention_dropout) applies only with training = True: on the
  embeddings, the attention probabilities and the attention and FFN outputs. Encoder.forward keeps
  the autograd graph (scripts/hf/modeling_xlme.py fine-tunes through it); hidden_states does not.
--inputs / --out / --compare files are safetensors: input_ids (I64 [B, T]), optional positions
(I64 [B, T], default default_positions: 0..T-1 less the row's leading padding) and padding
(BOOL [B, T], true at <pad>); outputs hidden.<i>
(F32 [B, T, hidden], i = 0 for the embeddings .. layers). --compare prints one JSON line with the
largest |difference| per hidden state over non-padded positions and exits 1 above --tolerance.
"""
import argparse
import importlib
import json
import math
import os
import reprlib
import struct
import sys
import types
import zlib

import numpy as np


class _OnFirstUse:
    """A module imported when one of its names is first used: the command line checks the files
    it is given before paying the seconds that importing torch takes, so a malformed file is
    refused at once."""

    def __init__(self, name):
        self._name, self._module = name, None

    def __getattr__(self, attr):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


torch = _OnFirstUse("torch")
F = _OnFirstUse("torch.nn.functional")

# --- reading files that others made -------------------------------------------------------------

class ExportError(ValueError):
    """A file that is not what it should be; the message names the file (and the tensor or key).
    The command line prints it as one line and exits 1."""


_MAX_JSON_DEPTH = 64  # as xlme's C++ reader (kMaxJsonDepth): its own files nest three levels
_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother = 3, 80, 80
_BRIEF.maxlist = _BRIEF.maxdict = 8


def brief(value):
    """An untrusted value for a message, bounded however large or deep: its type and a prefix."""
    return f"{type(value).__name__} {_BRIEF.repr(value)}"


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs):
    """An object's pairs as a dict; a key listed twice is refused (readers keep different copies)."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def parse_json(raw, what):
    """JSON from untrusted bytes; `what` names them in errors (not UTF-8, not JSON, too deep)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ExportError(f"{what} is not UTF-8 text (byte {e.start} is {raw[e.start]:#04x})") \
            from None
    try:
        value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise ExportError(f"{what} lists the key {json.dumps(str(e.args[0])[:80])} twice; readers "
                          "differ on which copy they keep: the file is damaged or was made to "
                          "break readers") from None
    except RecursionError:
        value = None  # deeper than Python's recursion limit: reported below
        depth = sys.getrecursionlimit()
    except ValueError as e:
        raise ExportError(f"{what} is not valid JSON: {e}") from None
    else:
        depth, stack = 0, [(value, 1)]
        while stack and depth <= _MAX_JSON_DEPTH:
            item, level = stack.pop()
            if isinstance(item, (list, dict)):
                depth = max(depth, level)
                stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict)
                                                       else item))
    if depth > _MAX_JSON_DEPTH:
        raise ExportError(f"{what} is nested too deeply: more than {_MAX_JSON_DEPTH} levels of "
                          "lists and objects (xlme's own files nest 3)")
    return value


# --- safetensors (https://github.com/huggingface/safetensors), read and written with numpy ------

_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                 "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
_DTYPE_BYTES = {**{k: np.dtype(v).itemsize for k, v in _NUMPY_DTYPES.items()}, "BF16": 2}
_MAX_HEADER = 100 * 1024 * 1024  # the format's own cap
_MAX_SIZE = 2**63 - 1  # sizes and byte counts must fit LibTorch's int64, as in the C++ reader
_MAX_DIMS = 64


def _is_size(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_SIZE


def _tensor_span(path, name, spec):
    """(begin, end, dtype, shape) of one header entry, checked as the C++ reader checks it."""
    where = f"safetensors file '{path}': tensor '{name}'"
    if not (isinstance(spec, dict) and {"dtype", "shape", "data_offsets"} <= spec.keys()):
        raise ExportError(f"{where} needs an object with dtype, shape and data_offsets, got "
                          f"{brief(spec)}")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPE_BYTES:
        raise ExportError(f"{where} has the unknown dtype {brief(dtype)}; known: "
                          f"{', '.join(_DTYPE_BYTES)}")
    if not isinstance(shape, list) or not all(_is_size(size) for size in shape):
        raise ExportError(f"{where}: its shape must be a list of sizes, got {brief(shape)}")
    if len(shape) > _MAX_DIMS:
        raise ExportError(f"{where} has {len(shape)} dimensions; at most {_MAX_DIMS} are read")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_size, offsets))
            and offsets[0] <= offsets[1]):
        raise ExportError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, "
                          f"got {brief(offsets)}")
    bound = math.prod(max(size, 1) for size in shape) * _DTYPE_BYTES[dtype]
    if bound > _MAX_SIZE:
        raise ExportError(f"{where} ({dtype} of shape {shape}) would need more than 2^63 bytes "
                          "(its size overflows); the header is damaged or was made to break "
                          "readers")
    needed = 0 if 0 in shape else bound
    if offsets[1] - offsets[0] != needed:
        raise ExportError(f"{where} ({dtype} of shape {shape}) needs {needed} bytes but its "
                          f"data_offsets {offsets} span {offsets[1] - offsets[0]}")
    return offsets[0], offsets[1], dtype, shape


def read_safetensors(path):
    """Returns ({name: torch.Tensor}, {metadata}). BF16 becomes float32 (exactly). Every header
    is checked as xlme's C++ reader checks it; a malformed file is an ExportError naming it."""
    arrays, metadata = read_safetensors_arrays(path)
    return {name: torch.from_numpy(array) for name, array in arrays.items()}, metadata


def read_safetensors_header(path):
    """({name: (dtype, shape)}, {metadata}) of a safetensors file, every header entry checked
    against the file's real size as read_safetensors_arrays checks it, without reading any data."""
    spans, metadata, _ = _safetensors_layout(path)
    return {name: (dtype, shape) for (_, _, dtype, shape), name in spans}, metadata


def _safetensors_layout(path):
    """(sorted spans, metadata, data start) of a checked header; reads the header alone."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ExportError(f"safetensors file '{path}' is {size} bytes long, shorter than "
                              "its 8-byte header size; it is truncated or not a safetensors file")
        (header_size,) = struct.unpack("<Q", f.read(8))
        if header_size > size - 8 or header_size > _MAX_HEADER:
            raise ExportError(f"safetensors file '{path}' announces a {header_size}-byte header "
                              f"but the file has only {size - 8} bytes after the size; it is "
                              "truncated or not a safetensors file")
        text = f.read(header_size)
    header = parse_json(text, f"safetensors file '{path}': the header")
    if not isinstance(header, dict):
        raise ExportError(f"safetensors file '{path}': the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise ExportError(f"safetensors file '{path}': __metadata__ must be an object of "
                          f"strings, got {brief(metadata)}")
    spans = sorted((_tensor_span(path, name, spec), name) for name, spec in header.items())
    # The tensors must tile the data region exactly: no overlap, no gap, nothing left over.
    start, covered, previous = 8 + header_size, 0, None
    for (begin, end, _, _), name in spans:
        if begin < covered:
            raise ExportError(f"safetensors file '{path}': tensors '{previous}' and '{name}' "
                              f"overlap (bytes [{begin}, {covered}) of the data)")
        if begin > covered:
            raise ExportError(f"safetensors file '{path}': bytes [{covered}, {begin}) of the data "
                              f"belong to no tensor (before '{name}')")
        covered, previous = end, name
    if covered != size - start:
        raise ExportError(f"safetensors file '{path}': its tensors cover {covered} bytes of data "
                          f"but the file holds {size - start}; it is truncated or damaged")
    return spans, metadata, start


def read_safetensors_arrays(path, names=None):
    """read_safetensors with numpy arrays: ({name: np.ndarray}, {metadata}), without torch. With
    `names`, only those tensors are read (the others are never read nor allocated)."""
    spans, metadata, start = _safetensors_layout(path)
    tensors = {}
    with open(path, "rb") as f:
        for (begin, end, dtype, shape), name in spans:
            if names is not None and name not in names:
                continue
            f.seek(start + begin)
            raw = f.read(end - begin)
            if len(raw) != end - begin:
                raise ExportError(f"safetensors file '{path}': tensor '{name}' is cut short "
                                  "(the file changed while it was read?)")
            if dtype == "BF16":
                # bfloat16 is the upper half of a float32.
                array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                array = np.frombuffer(raw, dtype=_NUMPY_DTYPES[dtype])
            tensors[name] = array.reshape(shape).copy()
    return tensors, metadata


def _check_declared(config, declared, config_path, weights_path):
    """Before any data is read: every weight config.json gives a shape is stored as config.json's
    dtype (F32, or BF16 for a bfloat16 export), and the tensors it gives no shape (the heads) hold
    no more data than those it does: an extra tensor declared larger is refused by name, unread."""
    known = expected_shapes(config, "discriminator")
    if isinstance(config.get("generator"), dict) and config["generator"].get("exported") is True:
        known.update(expected_shapes(config, "generator"))
    stored = "BF16" if config.get("dtype") == "bfloat16" else "F32"
    known_bytes = 0
    for name, (dtype, shape) in declared.items():
        if name in known:
            if dtype != stored:
                raise ExportError(f"safetensors file '{weights_path}': tensor '{name}' is {dtype}, "
                                  f"but export config '{config_path}' says dtype "
                                  f"{config.get('dtype')} ({stored}); no conversion applies: "
                                  "export the checkpoint again")
            known_bytes += math.prod(shape) * _DTYPE_BYTES[dtype]
    for name, (dtype, shape) in declared.items():
        if name not in known:
            size = math.prod(shape) * _DTYPE_BYTES[dtype]
            if size > known_bytes:
                raise ExportError(f"safetensors file '{weights_path}': tensor '{name}' ({dtype} "
                                  f"of shape {shape}, {size} bytes) is not a weight of the model "
                                  f"export config '{config_path}' describes, and is larger than "
                                  f"all of its weights ({known_bytes} bytes); it is not read")


def _check_finite(weights, weights_path):
    """NaN or infinite weights (a run that diverged before it was saved) are refused, as the C++
    readers refuse them."""
    for name, array in sorted(weights.items()):
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            raise ExportError(f"safetensors file '{weights_path}': tensor '{name}' holds {bad} NaN "
                              f"or infinite values of {array.size}: the run diverged before "
                              "these weights were saved; export an earlier checkpoint")


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (float32, int64, bool) as safetensors, tensors in name order."""
    codes = {torch.float32: "F32", torch.int64: "I64", torch.bool: "BOOL"}
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        blob = t.numpy().astype(_NUMPY_DTYPES[codes[t.dtype]]).tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# --- the model ---------------------------------------------------------------------------------

def relative_position_bucket(delta, num_buckets, max_distance):
    """Bucket of delta = i - j (query minus key position). Half of the buckets per direction
    (delta > 0, keys to the left, takes the upper half); in each half the first half are exact
    distances, the rest log-spaced up to max_distance; the last bucket takes longer ones."""
    half = num_buckets // 2
    exact = half // 2
    offset = half if delta > 0 else 0
    distance = abs(delta)
    if distance < exact:
        return offset + distance
    scaled = (math.log(distance / exact) / math.log(max_distance / exact) * (half - exact))
    return offset + min(exact + int(math.floor(scaled + 1e-9)), half - 1)


def bucket_matrix(length, num_buckets, max_distance):
    """[T, T] int64: the bucket of (i - j) at (i, j)."""
    per_delta = [relative_position_bucket(d, num_buckets, max_distance)
                 for d in range(-(length - 1), length)]
    idx = torch.arange(length)
    return torch.tensor(per_delta)[(idx[:, None] - idx[None, :]) + length - 1]


def default_positions(ids, padding=None):
    """[B, T] position ids as xlme's C++ model::default_positions: 0..T-1 in every row, less the
    row's leading padding (clamped at 0), so that a left-padded row gives a right-padded row's
    outputs."""
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    if padding is None:
        return positions
    leading = padding.long().cumprod(1).sum(1, keepdim=True)  # [B, 1]
    return (positions - leading).clamp(min=0)


class Encoder:
    """One xlme encoder (the discriminator, or the exported generator) from the weights."""

    def __init__(self, config, weights, name="discriminator"):
        self.w = {k: v.float() for k, v in weights.items()}
        self.name = name
        rp = config["relative_position"]
        self.relative, self.gated = rp["enabled"], rp["gated"]
        self.shared_table = rp["shared_across_layers"]
        self.num_buckets, self.max_distance = rp["num_buckets"], rp["max_distance"]
        self.absolute = config["absolute_positions"]
        self.pre_norm = config["norm"] == "pre"
        self.eps = config["layer_norm_eps"]
        shape = config if name == "discriminator" else config["generator"]
        self.layers, self.heads = shape["layers"], shape["heads"]
        # ALBERT's layer sharing: a shared sub-layer's weights are layers.0's at every depth.
        share = config.get("share_layers", "none")
        self.shared_attention, self.shared_ffn = share in ("all", "attention"), share in ("all", "ffn")
        self.hidden = shape["hidden_size"]
        self.dropout, self.attention_dropout = config["dropout"], config["attention_dropout"]
        self.training = False

    def _p(self, key):
        return self.w[f"{self.name}.{key}"]

    def _has(self, key):
        return f"{self.name}.{key}" in self.w

    def _linear(self, x, key):
        return F.linear(x, self._p(key + ".weight"), self._p(key + ".bias"))

    def _norm(self, x, key):
        return F.layer_norm(x, (x.shape[-1],), self._p(key + ".weight"), self._p(key + ".bias"),
                            self.eps)

    def embed(self, ids, positions):
        x = F.embedding(ids, self.w["embeddings.token.weight"])
        if self._has("token_delta"):  # gdes: the discriminator's own delta on the shared table
            x = x + F.embedding(ids, self._p("token_delta"))
        if self.absolute:
            x = x + F.embedding(positions, self.w["embeddings.position.weight"])
            if self._has("position_delta"):
                x = x + F.embedding(positions, self._p("position_delta"))
        x = F.dropout(self._norm(x, "embedding_norm"), self.dropout, self.training)
        if self._has("embedding_projection.weight"):
            x = self._linear(x, "embedding_projection")
        return x

    def attention(self, x, padding, layer, buckets):
        b, t, _ = x.shape
        h, d_k = self.heads, self.hidden // self.heads

        def split(y):  # [B, T, hidden] -> [B, H, T, d_k]
            return y.view(b, t, h, d_k).transpose(1, 2)

        q = split(self._linear(x, f"{layer}.query"))
        k = split(self._linear(x, f"{layer}.key"))
        v = split(self._linear(x, f"{layer}.value"))
        scores = torch.matmul(q / math.sqrt(d_k), k.transpose(-2, -1))  # [B, H, T, T]
        if self.relative:
            d = self._p("relative_bias") if self.shared_table else self._p(f"{layer}.relative_bias")
            table = d[:, buckets]  # [H, T, T]: d_{h, b(i-j)}
            if self.gated:
                g_u = torch.sigmoid(torch.einsum("bhtd,hd->bht", q, self._p(f"{layer}.gate_u")))
                g_r = torch.sigmoid(torch.einsum("bhtd,hd->bht", q, self._p(f"{layer}.gate_v")))
                w = self._p(f"{layer}.gate_w").view(1, -1, 1)
                gate = 1 + g_u + (1 - g_u) * w * g_r  # [B, H, T]: scales query i's bias row
                scores = scores + gate.unsqueeze(-1) * table
            else:
                scores = scores + table
        if padding is not None:
            scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
        probs = F.dropout(torch.softmax(scores, -1), self.attention_dropout, self.training)
        context = torch.matmul(probs, v)  # [B, H, T, d_k]
        return self._linear(context.transpose(1, 2).reshape(b, t, self.hidden), f"{layer}.output")

    def ffn(self, x, layer):
        return self._linear(F.gelu(self._linear(x, f"{layer}.ffn.intermediate")),
                            f"{layer}.ffn.output")

    def forward(self, ids, positions=None, padding=None):
        """ids: [B, T] int64; positions: [B, T] (default: default_positions); padding: [B, T]
        bool, true at <pad>. Returns [embedding output, layer 1, ..., layer L], each
        [B, T, hidden]."""
        if positions is None:
            positions = default_positions(ids, padding)
        buckets = bucket_matrix(ids.shape[1], self.num_buckets, self.max_distance).to(ids.device)
        x = self.embed(ids, positions)
        states = [x]

        def drop(y):
            return F.dropout(y, self.dropout, self.training)

        for i in range(self.layers):
            a = f"layers.{0 if self.shared_attention else i}"  # the attention's weights
            f = f"layers.{0 if self.shared_ffn else i}"  # the FFN's
            if self.pre_norm:
                x = x + drop(self.attention(self._norm(x, f"{a}.attention_norm"), padding,
                                            f"{a}.attention", buckets))
                x = x + drop(self.ffn(self._norm(x, f"{f}.ffn_norm"), f))
            else:
                x = self._norm(x + drop(self.attention(x, padding, f"{a}.attention", buckets)),
                               f"{a}.attention_norm")
                x = self._norm(x + drop(self.ffn(x, f)), f"{f}.ffn_norm")
            states.append(x)
        if self.pre_norm:
            states[-1] = self._norm(x, "final_norm")
        return states

    def hidden_states(self, ids, positions=None, padding=None):
        """forward without autograd."""
        with torch.no_grad():
            return self.forward(ids, positions, padding)

    def rtd_logits(self, hidden):
        """[B, T, hidden] -> [B, T]: replaced-token logits of the discriminator head."""
        with torch.no_grad():
            x = F.gelu(F.linear(hidden, self.w["discriminator_head.dense.weight"],
                                self.w["discriminator_head.dense.bias"]))
            return F.linear(x, self.w["discriminator_head.output.weight"],
                            self.w["discriminator_head.output.bias"]).squeeze(-1)


def _check_config(config, path):
    """The keys Encoder reads, with their types and the limits of xlme's model config."""
    def get(section, key, kinds, valid, expected, prefix=""):
        value = section.get(key) if isinstance(section, dict) else None
        if not isinstance(value, kinds) or isinstance(value, bool) != (kinds is bool) \
                or not valid(value):
            raise ExportError(f"export config '{path}': '{prefix}{key}' must be {expected}, got "
                              f"{brief(value)}")
        return value

    flag = (bool, lambda v: True, "true or false")
    rp = config.get("relative_position")
    for key in ("enabled", "gated", "shared_across_layers"):
        get(rp, key, *flag, prefix="relative_position.")
    buckets = get(rp, "num_buckets", int, lambda v: 4 <= v <= 1024 and v % 2 == 0,
                  "an even integer in [4, 1024]", prefix="relative_position.")
    get(rp, "max_distance", int, lambda v: buckets // 4 < v <= 1048576,
        f"an integer in [2, 1048576] above num_buckets / 4 ({buckets // 4})",
        prefix="relative_position.")
    get(config, "absolute_positions", *flag)
    if "share_layers" in config:
        get(config, "share_layers", str, lambda v: v in ("none", "all", "attention", "ffn"),
            "none, all, attention or ffn")
    if "cross_attention" in config:
        # VECO's cross-attention is plugged out of every export: the encoder is the self-attention
        # stack.
        get(config, "cross_attention", bool, lambda v: v is False,
            "false (exports leave VECO's cross-attention out)")
    get(config, "norm", str, lambda v: v in ("post", "pre"), "post or pre")
    get(config, "layer_norm_eps", (int, float), lambda v: 0 < v <= 1, "a number in (0, 1]")
    for key in ("dropout", "attention_dropout"):
        get(config, key, (int, float), lambda v: 0 <= v < 1, "a number in [0, 1)")
    vocab = get(config, "vocab_size", int, lambda v: 1 <= v <= 2147483647,
                "an integer in [1, 2147483647]")
    get(config, "max_positions", int, lambda v: 1 <= v <= 1048576, "an integer in [1, 1048576]")
    for shape, prefix in ((config, ""), (config.get("generator"), "generator.")):
        get(shape, "layers", int, lambda v: 1 <= v <= 1024, "an integer in [1, 1024]", prefix)
        size = get(shape, "hidden_size", int, lambda v: 1 <= v <= 65536,
                   "an integer in [1, 65536]", prefix)
        get(shape, "heads", int, lambda v: 1 <= v <= 1024 and size % v == 0,
            f"an integer in [1, 1024] dividing {prefix}hidden_size ({size})", prefix)
        get(shape, "ffn_size", int, lambda v: 1 <= v <= 1048576, "an integer in [1, 1048576]",
            prefix)
    hidden = config["hidden_size"]
    get(config, "embedding_size", int, lambda v: 1 <= v <= hidden,
        f"an integer in [1, hidden_size ({hidden})]")
    for key in ("bos", "pad", "eos", "unk", "mask"):
        get(config.get("special_ids"), key, int, lambda v: 0 <= v < vocab,
            f"an id of the vocabulary, in [0, vocab_size ({vocab}))", "special_ids.")


def expected_shapes(config, name="discriminator"):
    """{tensor: [(config key, size), ...]}: the shape config.json gives each weight that Encoder
    reads for the encoder `name` (whether the weights hold it or not)."""
    prefix = "" if name == "discriminator" else "generator."
    shape = config if name == "discriminator" else config["generator"]
    vocab, emb = ("vocab_size", config["vocab_size"]), ("embedding_size", config["embedding_size"])
    hidden = (prefix + "hidden_size", shape["hidden_size"])
    heads = (prefix + "heads", shape["heads"])
    head_size = (f"{prefix}hidden_size / {prefix}heads", shape["hidden_size"] // shape["heads"])
    ffn = (prefix + "ffn_size", shape["ffn_size"])
    buckets = ("relative_position.num_buckets", config["relative_position"]["num_buckets"])
    positions = ("max_positions", config["max_positions"])
    out = {"embeddings.token.weight": [vocab, emb], "embeddings.position.weight": [positions, emb],
           f"{name}.token_delta": [vocab, emb], f"{name}.position_delta": [positions, emb],
           f"{name}.embedding_norm.weight": [emb], f"{name}.embedding_norm.bias": [emb],
           f"{name}.embedding_projection.weight": [hidden, emb],
           f"{name}.embedding_projection.bias": [hidden],
           f"{name}.relative_bias": [heads, buckets],
           f"{name}.final_norm.weight": [hidden], f"{name}.final_norm.bias": [hidden]}
    for i in range(shape["layers"]):
        layer = f"{name}.layers.{i}"
        for part in ("query", "key", "value", "output"):
            out[f"{layer}.attention.{part}.weight"] = [hidden, hidden]
            out[f"{layer}.attention.{part}.bias"] = [hidden]
        out[f"{layer}.attention.relative_bias"] = [heads, buckets]
        out[f"{layer}.attention.gate_u"] = [heads, head_size]
        out[f"{layer}.attention.gate_v"] = [heads, head_size]
        out[f"{layer}.attention.gate_w"] = [heads]
        for norm in ("attention_norm", "ffn_norm"):
            out[f"{layer}.{norm}.weight"] = [hidden]
            out[f"{layer}.{norm}.bias"] = [hidden]
        out[f"{layer}.ffn.intermediate.weight"] = [ffn, hidden]
        out[f"{layer}.ffn.intermediate.bias"] = [ffn]
        out[f"{layer}.ffn.output.weight"] = [hidden, ffn]
        out[f"{layer}.ffn.output.bias"] = [hidden]
    return out


def _check_shapes(config, weights, name, config_path, weights_path):
    """Every weight Encoder reads has the shape config.json gives it (a tensor it lacks is named
    when the forward pass asks for it)."""
    for tensor, dims in expected_shapes(config, name).items():
        if tensor in weights and list(weights[tensor].shape) != [size for _, size in dims]:
            said = ", ".join(f"{size} ({key})" for key, size in dims)
            raise ExportError(f"safetensors file '{weights_path}': tensor '{tensor}' has shape "
                              f"{list(weights[tensor].shape)}, but export config '{config_path}' "
                              f"gives it [{said}]; the weights and the config do not belong "
                              "together")


def _check_tokenizer(folder, config, config_path):
    """spm.model is the SentencePiece model the export was made with: config.json's spm_model
    records its size and CRC32 (exports older than the record are not checked)."""
    record = config.get("spm_model")
    if record is None:
        return
    if not (isinstance(record, dict) and record.get("file") == "spm.model"
            and _is_size(record.get("bytes")) and isinstance(record.get("crc32"), str)
            and len(record["crc32"]) == 8
            and all(c in "0123456789abcdef" for c in record["crc32"])):
        raise ExportError(f"export config '{config_path}': 'spm_model' must be an object with "
                          "file 'spm.model', bytes and crc32 (8 lowercase hex digits), got "
                          f"{brief(record)}")
    path = os.path.join(folder, "spm.model")
    with open(path, "rb") as f:
        data = f.read()
    found = (len(data), f"{zlib.crc32(data):08x}")
    if found != (record["bytes"], record["crc32"]):
        raise ExportError(f"'{path}' ({found[0]} bytes, CRC32 {found[1]}) is not the SentencePiece "
                          f"model this export was made with: export config '{config_path}' "
                          f"records {record['bytes']} bytes, CRC32 {record['crc32']}; its ids "
                          "would mean other pieces. Put the export's own spm.model back, or "
                          "export the checkpoint again")


def _checked_files(folder, encoder):
    """config.json, the weights as numpy arrays and their path, every check done that needs no
    torch: the config's keys, the tokenizer's record, the safetensors header, the shapes."""
    path = os.path.join(folder, "config.json")
    with open(path, "rb") as f:
        config = parse_json(f.read(), f"export config '{path}'")
    if not isinstance(config, dict) or config.get("format") != "xlme-export" \
            or config.get("format_version") != 1:
        raise ExportError(f"{folder}: not an xlme-export folder of format version 1 ({path})")
    _check_config(config, path)
    generator = config.get("generator")
    if encoder == "generator" and generator.get("exported") is not True:
        raise ExportError(f"{folder}: the generator was not exported "
                          "(xlme-export --with-generator)")
    _check_tokenizer(folder, config, path)
    weights_path = os.path.join(folder, "model.safetensors")
    declared, _ = read_safetensors_header(weights_path)
    _check_declared(config, declared, path, weights_path)
    _check_shapes(config, {name: types.SimpleNamespace(shape=shape)
                           for name, (_, shape) in declared.items()}, encoder, path, weights_path)
    weights, _ = read_safetensors_arrays(weights_path)
    _check_finite(weights, weights_path)
    return config, weights, weights_path


def _encoder(config, weights, weights_path, encoder):
    model = Encoder(config, {name: torch.from_numpy(a) for name, a in weights.items()}, encoder)
    model.config = config
    model.weights_path = weights_path
    return model


def load_model(folder, encoder="discriminator"):
    """The encoder of an xlme-export folder (config.json + model.safetensors); a malformed file is
    an ExportError naming it."""
    return _encoder(*_checked_files(folder, encoder), encoder)


# --- command line ------------------------------------------------------------------------------

def inputs_from_ids(rows, pad):
    """["0 17 2", "0 5 6 7 2"] -> ids [B, T] (int64) padded with <pad>, padding mask (bool), as
    numpy arrays."""
    try:
        seqs = [[int(token) for token in row.split()] for row in rows]
    except ValueError as e:
        raise ExportError(f"--ids takes token ids separated by spaces ({e})") from None
    if not all(seqs):
        raise ExportError("--ids: every sequence needs at least one token id")
    length = max(len(s) for s in seqs)
    ids = np.full((len(seqs), length), pad, dtype=np.int64)
    padding = np.ones((len(seqs), length), dtype=bool)
    for i, s in enumerate(seqs):
        try:
            ids[i, :len(s)] = s
        except OverflowError:
            raise ExportError(f"--ids: token id out of the int64 range in sequence {i}") from None
        padding[i, :len(s)] = False
    return ids, padding


def check_inputs(config, ids, positions, where):
    """Token ids inside config.json's vocabulary and positions inside its max_positions (where an
    embedding row is looked up); `where` names the input (a file or --ids) in the error. Numpy
    arrays."""
    vocab, most = config["vocab_size"], config["max_positions"]
    if ids.ndim != 2:
        raise ExportError(f"{where}: input_ids must be [batch, length], got shape {list(ids.shape)}")
    bad = (ids < 0) | (ids >= vocab)
    if bool(bad.any()):
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ExportError(f"{where}: token id {int(ids[row, col])} (sequence {row}, position "
                          f"{col}) is outside the vocabulary of {vocab} ids (vocab_size in "
                          "config.json)")
    if config["absolute_positions"]:
        if positions is None and ids.shape[1] > most:
            raise ExportError(f"{where}: sequences of {ids.shape[1]} tokens are longer than the "
                              f"model's max_positions ({most}, config.json)")
        if positions is not None and (positions.shape != ids.shape or
                                      bool(((positions < 0) | (positions >= most)).any())):
            raise ExportError(f"{where}: positions must have input_ids' shape {list(ids.shape)} "
                              f"and lie in [0, max_positions ({most}, config.json))")


def run(args):
    # Every file is read and checked before torch is imported and the model built: a malformed
    # one is refused at once.
    if args.inputs:
        inputs, _ = read_safetensors_arrays(args.inputs)
        if "input_ids" not in inputs:
            raise ExportError(f"safetensors file '{args.inputs}' has no tensor 'input_ids'")
        ids = inputs["input_ids"].astype(np.int64)
        positions = inputs["positions"].astype(np.int64) if "positions" in inputs else None
        padding = inputs["padding"].astype(bool) if "padding" in inputs else None
    elif not args.ids:
        raise ExportError("give --ids or --inputs")
    config, weights, weights_path = _checked_files(args.model, args.encoder)
    if not args.inputs:
        ids, padding = inputs_from_ids(args.ids, config["special_ids"]["pad"])
        positions = None
    check_inputs(config, ids, positions, args.inputs or "--ids")
    model = _encoder(config, weights, weights_path, args.encoder)
    ids = torch.from_numpy(ids)
    positions = torch.from_numpy(positions) if positions is not None else None
    padding = torch.from_numpy(padding) if padding is not None else None
    try:
        states = model.hidden_states(ids, positions, padding)
    except KeyError as e:  # Encoder reads the weights by name as it goes
        raise ExportError(f"safetensors file '{model.weights_path}' has no tensor {e}, which the "
                          "model of its config.json needs") from None

    if args.out:
        write_safetensors(args.out, {f"hidden.{i}": s for i, s in enumerate(states)})
    if args.compare:
        expected, _ = read_safetensors(args.compare)
        missing = [f"hidden.{i}" for i in range(len(states)) if f"hidden.{i}" not in expected]
        if missing:
            raise ExportError(f"safetensors file '{args.compare}' has no tensor {missing[0]}")
        real = ~padding if padding is not None else torch.ones(ids.shape, dtype=torch.bool)
        diffs = [float((s - expected[f"hidden.{i}"].float()).abs()[real].max())
                 for i, s in enumerate(states)]
        print(json.dumps({"max_abs_diff": diffs, "max": max(diffs), "layers": len(diffs) - 1}))
        return 0 if max(diffs) <= args.tolerance else 1
    if not args.out and not args.compare:
        for i, s in enumerate(states):
            print(f"hidden.{i}: shape {list(s.shape)}, first values "
                  f"{[round(v, 4) for v in s[0, 0, :4].tolist()]}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="xlme-export folder")
    parser.add_argument("--encoder", default="discriminator",
                        choices=["discriminator", "generator"])
    parser.add_argument("--ids", action="append", help="one sequence of token ids (repeatable)")
    parser.add_argument("--inputs", help="safetensors with input_ids [, positions, padding]")
    parser.add_argument("--out", help="write hidden.<i> to this safetensors file")
    parser.add_argument("--compare", help="safetensors with the expected hidden.<i>")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    try:
        sys.exit(run(args))
    except (ExportError, OSError) as e:  # one line naming the file, no traceback
        sys.exit(f"xlme_reference.py: error: {e}")


if __name__ == "__main__":
    main()
