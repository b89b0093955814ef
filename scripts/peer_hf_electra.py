#!/usr/bin/env python3
"""The PyTorch peer of xlme's GPU benchmark: HuggingFace transformers' ELECTRA, timed the way
`xlme-pretrain --benchmark` times a step (docs/gpu.md#the-pytorch-peer).

Shapes default to the paper's Base run as configs/pretrain/base.yaml has it: discriminator 12 x 768
(12 heads, FFN 3072), generator 4 x 768, vocabulary 250,002, sequences of 512, 15% masked, micro-
batches of 16,384 tokens (32 sequences), bf16 autocast, lambda 50, AdamW (betas 0.9/0.98, eps 1e-6,
weight decay 0.01), gradient clipping at 2.0. One step per micro-batch:

  1. random ids (0..4 are specials) and exactly round(0.15 * seq) masked positions per sequence,
     drawn on the device;
  2. generator encoder, its prediction head at the masked positions only (as xlme's), MLM loss;
  3. replacements drawn from the generator's softmax (Gumbel-max, no gradient);
  4. discriminator over the corrupted sequence, BCE over every token;
  5. mlm + lambda * rtd, backward, clip, AdamW (PyTorch's default implementation, `--fused-adam`
     for the fused one).

Generator and discriminator share the word and position embeddings, and the generator's output
projection is tied to the shared word matrix, as in ELECTRA. Timed with CUDA synchronisation around
the timed steps; prints one JSON line: tokens/s, ms per step, peak memory, versions, attention
implementation.

  python3 scripts/peer_hf_electra.py [--steps 10] [--batch 32] [--seq 512] ...
"""

import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--disc-layers", type=int, default=12)
    p.add_argument("--gen-layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--vocab", type=int, default=250002)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=32, help="sequences per micro-batch")
    p.add_argument("--steps", type=int, default=10, help="timed steps (one micro-batch each)")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--mask-prob", type=float, default=0.15)
    p.add_argument("--lambda", dest="rtd_weight", type=float, default=50.0)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument("--attention", default="sdpa", help="attn_implementation: sdpa or eager")
    p.add_argument("--fused-adam", action="store_true", help="torch.optim.AdamW(fused=True)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 0:
        p.error("need --steps >= 1 and --warmup-steps >= 0")
    return args


MASK_ID, FIRST_REAL_ID = 4, 5


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

    device = torch.device(args.device)
    torch.manual_seed(args.seed)

    def config(layers):
        c = ElectraConfig(vocab_size=args.vocab, embedding_size=args.hidden,
                          hidden_size=args.hidden, num_hidden_layers=layers,
                          num_attention_heads=args.heads, intermediate_size=args.ffn,
                          hidden_act="gelu", hidden_dropout_prob=args.dropout,
                          attention_probs_dropout_prob=args.dropout,
                          max_position_embeddings=max(512, args.seq), pad_token_id=0)
        c._attn_implementation = args.attention
        return c

    generator = ElectraForMaskedLM(config(args.gen_layers))
    discriminator = ElectraForPreTraining(config(args.disc_layers))
    d_emb, g_emb = discriminator.electra.embeddings, generator.electra.embeddings
    g_emb.word_embeddings = d_emb.word_embeddings
    g_emb.position_embeddings = d_emb.position_embeddings
    generator.generator_lm_head.weight = d_emb.word_embeddings.weight
    generator.to(device).train()
    discriminator.to(device).train()

    params = list({id(p): p for m in (generator, discriminator) for p in m.parameters()}.values())
    optimizer = torch.optim.AdamW(params, lr=5e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01,
                                  **({"fused": True} if args.fused_adam else {}))
    B, S, V = args.batch, args.seq, args.vocab
    n_mask = max(1, round(args.mask_prob * S))
    rng = torch.Generator(device=device).manual_seed(args.seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=not args.fp32)

    def step():
        ids = torch.randint(FIRST_REAL_ID, V, (B, S), generator=rng, device=device)
        positions = torch.rand((B, S), generator=rng, device=device).topk(n_mask, dim=1).indices
        masked = torch.zeros((B, S), dtype=torch.bool, device=device).scatter_(1, positions, True)
        originals = ids[masked]
        with autocast:
            hidden = generator.electra(input_ids=ids.masked_fill(masked, MASK_ID)).last_hidden_state
            logits = generator.generator_lm_head(generator.generator_predictions(hidden[masked]))
            mlm = F.cross_entropy(logits.float(), originals)
            with torch.no_grad():
                u = torch.rand(logits.shape, generator=rng, device=device).clamp_(1e-10, 1 - 1e-7)
                sampled = (logits.float() - torch.log(-torch.log(u))).argmax(dim=-1)
                corrupted = ids.masked_scatter(masked, sampled)
                labels = (corrupted != ids).float()
            rtd_logits = discriminator(input_ids=corrupted).logits
            rtd = F.binary_cross_entropy_with_logits(rtd_logits.float(), labels)
            loss = mlm + args.rtd_weight * rtd
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 2.0)
        optimizer.step()
        return loss

    for _ in range(args.warmup_steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    start = time.perf_counter()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    elapsed = time.perf_counter() - start
    result = {
        "bench": "peer_hf_electra",
        "tokens_per_s": B * S * args.steps / elapsed,
        "ms_per_step": statistics.median(times),
        "ms_per_step_min": min(times),
        "tokens_per_step": B * S,
        "last_loss": float(loss.detach()),
        "peak_memory_mib": (torch.cuda.max_memory_allocated() / 2**20
                            if device.type == "cuda" else None),
        "params": sum(p.numel() for p in params),
        "precision": "fp32" if args.fp32 else "bf16-autocast",
        "attention": getattr(discriminator.config, "_attn_implementation", args.attention),
        "fused_adam": args.fused_adam,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "config": vars(args),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
