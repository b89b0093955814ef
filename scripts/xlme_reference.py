#!/usr/bin/python3
"""A pure PyTorch reference for xlme's encoder: loads an xlme-export folder and computes every
layer's hidden states, as the C++ model does (DESIGN section 5). Needs only torch and numpy;
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
(I64 [B, T], default 0..T-1) and padding (BOOL [B, T], true at <pad>); outputs hidden.<i>
(F32 [B, T, hidden], i = 0 for the embeddings .. layers). --compare prints one JSON line with the
largest |difference| per hidden state over non-padded positions and exits 1 above --tolerance.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

# --- safetensors (https://github.com/huggingface/safetensors), read and written with numpy ------

_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                 "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """Returns ({name: torch.Tensor}, {metadata}). BF16 becomes float32 (exactly)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header size")
    (header_size,) = struct.unpack("<Q", data[:8])
    if header_size > len(data) - 8:
        raise ValueError(f"{path}: header of {header_size} bytes beyond the end of the file")
    header = json.loads(data[8:8 + header_size])
    start = 8 + header_size
    tensors = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        begin, end = spec["data_offsets"]
        if start + end > len(data):
            raise ValueError(f"{path}: tensor {name} runs past the end of the file (truncated)")
        raw = data[start + begin:start + end]
        if spec["dtype"] == "BF16":
            # bfloat16 is the upper half of a float32.
            array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=_NUMPY_DTYPES[spec["dtype"]])
        tensors[name] = torch.from_numpy(array.reshape(spec["shape"]).copy())
    return tensors, header.get("__metadata__", {})


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
        """ids: [B, T] int64; positions: [B, T] (default 0..T-1); padding: [B, T] bool, true at
        <pad>. Returns [embedding output, layer 1, ..., layer L], each [B, T, hidden]."""
        if positions is None:
            positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        buckets = bucket_matrix(ids.shape[1], self.num_buckets, self.max_distance).to(ids.device)
        x = self.embed(ids, positions)
        states = [x]

        def drop(y):
            return F.dropout(y, self.dropout, self.training)

        for i in range(self.layers):
            layer = f"layers.{i}"
            if self.pre_norm:
                x = x + drop(self.attention(self._norm(x, f"{layer}.attention_norm"), padding,
                                            f"{layer}.attention", buckets))
                x = x + drop(self.ffn(self._norm(x, f"{layer}.ffn_norm"), layer))
            else:
                x = self._norm(x + drop(self.attention(x, padding, f"{layer}.attention", buckets)),
                               f"{layer}.attention_norm")
                x = self._norm(x + drop(self.ffn(x, layer)), f"{layer}.ffn_norm")
            states.append(x)
        if self.pre_norm:
            states[-1] = self._norm(x, "final_norm")
        return states

    @torch.no_grad()
    def hidden_states(self, ids, positions=None, padding=None):
        """forward without autograd."""
        return self.forward(ids, positions, padding)

    @torch.no_grad()
    def rtd_logits(self, hidden):
        """[B, T, hidden] -> [B, T]: replaced-token logits of the discriminator head."""
        x = F.gelu(F.linear(hidden, self.w["discriminator_head.dense.weight"],
                            self.w["discriminator_head.dense.bias"]))
        return F.linear(x, self.w["discriminator_head.output.weight"],
                        self.w["discriminator_head.output.bias"]).squeeze(-1)


def load_model(folder, encoder="discriminator"):
    """The encoder of an xlme-export folder (config.json + model.safetensors)."""
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("format") != "xlme-export" or config.get("format_version", 0) > 1:
        raise ValueError(f"{folder}: not an xlme-export folder of format version 1")
    if encoder == "generator" and not config["generator"]["exported"]:
        raise ValueError(f"{folder}: the generator was not exported (xlme-export --with-generator)")
    weights, _ = read_safetensors(os.path.join(folder, "model.safetensors"))
    model = Encoder(config, weights, encoder)
    model.config = config
    return model


# --- command line ------------------------------------------------------------------------------

def inputs_from_ids(rows, pad):
    """["0 17 2", "0 5 6 7 2"] -> ids [B, T] padded with <pad>, padding mask."""
    seqs = [[int(token) for token in row.split()] for row in rows]
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad, dtype=torch.int64)
    padding = torch.ones((len(seqs), length), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        padding[i, :len(s)] = False
    return ids, padding


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

    model = load_model(args.model, args.encoder)
    if args.inputs:
        inputs, _ = read_safetensors(args.inputs)
        ids = inputs["input_ids"].long()
        positions = inputs["positions"].long() if "positions" in inputs else None
        padding = inputs["padding"].bool() if "padding" in inputs else None
    elif args.ids:
        ids, padding = inputs_from_ids(args.ids, model.config["special_ids"]["pad"])
        positions = None
    else:
        sys.exit("give --ids or --inputs")
    states = model.hidden_states(ids, positions, padding)

    if args.out:
        write_safetensors(args.out, {f"hidden.{i}": s for i, s in enumerate(states)})
    if args.compare:
        expected, _ = read_safetensors(args.compare)
        real = ~padding if padding is not None else torch.ones(ids.shape, dtype=torch.bool)
        diffs = [float((s - expected[f"hidden.{i}"].float()).abs()[real].max())
                 for i, s in enumerate(states)]
        print(json.dumps({"max_abs_diff": diffs, "max": max(diffs), "layers": len(diffs) - 1}))
        sys.exit(0 if max(diffs) <= args.tolerance else 1)
    if not args.out and not args.compare:
        for i, s in enumerate(states):
            print(f"hidden.{i}: shape {list(s.shape)}, first values "
                  f"{[round(v, 4) for v in s[0, 0, :4].tolist()]}")


if __name__ == "__main__":
    main()
