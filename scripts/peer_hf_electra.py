#!/usr/bin/env python3
"""The PyTorch peer of `xlme-pretrain --benchmark`: HuggingFace transformers' ELECTRA, timed the way
xlme times a step, on a GPU (docs/gpu.md#checking-on-a-gpu) or on the CPU. scripts/compare_peer.sh
runs it beside xlme at the same shapes (docs/performance.md).

Shapes default to the paper's Base run as configs/pretrain/base.yaml has it: discriminator 12 x 768
(12 heads, FFN 3072), generator 4 x 768, vocabulary 250,002, sequences of 512, 15% masked, micro-
batches of 16,384 tokens (32 sequences), bf16 autocast, lambda 50, AdamW (betas 0.9/0.98, eps 1e-6,
weight decay 0.01), gradient clipping at 2.0. One step per micro-batch:

  1. random ids (0..4 are specials) and exactly round(0.15 * seq) masked positions per sequence
     (--xlme-masking: xlme's rule), drawn on the device;
  2. generator encoder, its prediction head at the masked positions only (as xlme's;
     --no-masked-only-head: ElectraForMaskedLM.forward, vocabulary logits at every position),
     MLM loss;
  3. replacements drawn from the generator's softmax (Gumbel-max, no gradient);
  4. discriminator over the corrupted sequence, BCE over every token;
  5. mlm + lambda * rtd, backward, clip, AdamW (PyTorch's default implementation, `--fused-adam`
     for the fused one).

Generator and discriminator share the word and position embeddings, and the generator's output
projection is tied to the shared word matrix, as in ELECTRA. Timed with CUDA synchronisation around
the timed steps; the last stdout line is one JSON object: tokens/s, ms per step, peak memory,
versions, attention implementation, and on the CPU the threads and how contended the machine was.

  python3 scripts/peer_hf_electra.py [--steps 10] [--batch 32] [--seq 512] ...
  python3 scripts/peer_hf_electra.py --device cpu --fp32 --hidden 128 --disc-layers 2 ...
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    shape = p.add_argument_group("shapes (xlme's model.* keys; the defaults are Base's)")
    shape.add_argument("--hidden", type=int, default=768, help="discriminator hidden size")
    shape.add_argument("--disc-layers", type=int, default=12)
    shape.add_argument("--heads", type=int, default=12, help="discriminator attention heads")
    shape.add_argument("--ffn", type=int, default=3072, help="discriminator FFN size")
    shape.add_argument("--gen-layers", type=int, default=4)
    shape.add_argument("--gen-hidden", type=int, default=0, help="0 = the discriminator's")
    shape.add_argument("--gen-heads", type=int, default=0, help="0 = the discriminator's")
    shape.add_argument("--gen-ffn", type=int, default=0, help="0 = the discriminator's")
    shape.add_argument("--embedding-size", type=int, default=0,
                       help="width of the shared embeddings; 0 = --hidden (HF projects them up "
                            "in a model that is wider)")
    shape.add_argument("--vocab", type=int, default=250002)
    shape.add_argument("--seq", type=int, default=512)
    shape.add_argument("--max-position", type=int, default=0,
                       help="rows of the position table; 0 = max(512, --seq)")
    shape.add_argument("--batch", type=int, default=32, help="sequences per micro-batch")
    p.add_argument("--steps", type=int, default=10, help="timed steps (one micro-batch each)")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--mask-prob", type=float, default=0.15)
    p.add_argument("--xlme-masking", action="store_true",
                   help="mask as xlme's synthetic batches do (src/data/masking.cpp): the first and "
                        "last position are <s> and </s>, of the seq - 2 others each sequence masks "
                        "mask_prob * (seq - 2) in expectation (randomized rounding)")
    p.add_argument("--lambda", dest="rtd_weight", type=float, default=50.0)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--attention-dropout", type=float, default=None, help="default: --dropout")
    p.add_argument("--clip", type=float, default=2.0, help="max global gradient norm; 0 = off")
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast (on the CPU too)")
    p.add_argument("--attention", default="sdpa", help="attn_implementation: sdpa or eager")
    p.add_argument("--masked-only-head", action=argparse.BooleanOptionalAction, default=True,
                   help="the generator's head at the masked positions only, as xlme's; "
                        "--no-masked-only-head: ElectraForMaskedLM.forward with labels, which "
                        "projects every position onto the vocabulary")
    p.add_argument("--fused-adam", action="store_true", help="torch.optim.AdamW(fused=True)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile both encoders (fixed [batch, seq] shapes; the warm-up "
                        "steps compile, so give --warmup-steps 3 or more)")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads; 0 = on the CPU every core the process may use (xlme's "
                        "run.threads=0), on a GPU torch's default")
    p.add_argument("--omp-wait-policy", choices=("passive", "active"), default=None,
                   help="OMP_WAIT_POLICY, set before torch loads; default: the environment's, and "
                        "on the CPU PASSIVE where it has none (what xlme's binaries do)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 0 or args.threads < 0:
        p.error("need --steps >= 1, --warmup-steps >= 0 and --threads >= 0")
    if not 0.0 < args.mask_prob < 1.0:
        p.error("--mask-prob must lie in (0, 1)")
    if args.vocab <= FIRST_REAL_ID:
        p.error(f"--vocab must leave room for the {FIRST_REAL_ID} special ids")
    args.gen_hidden = args.gen_hidden or args.hidden
    args.gen_heads = args.gen_heads or args.heads
    args.gen_ffn = args.gen_ffn or args.ffn
    args.embedding_size = args.embedding_size or args.hidden
    args.max_position = args.max_position or max(512, args.seq)
    if args.max_position < args.seq:
        p.error("--max-position must be at least --seq")
    if args.attention_dropout is None:
        args.attention_dropout = args.dropout
    return args


MASK_ID, FIRST_REAL_ID = 4, 5


def cpu_ticks():
    """(steal, total) jiffies of /proc/stat's aggregate cpu line; None where unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user and nice).
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def cpu_model():
    """The CPU's model name, as /proc/cpuinfo gives it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def main(argv=None):
    args = parse_args(argv)
    on_cpu = args.device.split(":")[0] == "cpu"
    # libgomp reads the wait policy and the thread count once, when torch loads.
    if args.omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    elif on_cpu:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if on_cpu and args.threads == 0:
        args.threads = len(os.sched_getaffinity(0))
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    def config(hidden, layers, heads, ffn):
        c = ElectraConfig(vocab_size=args.vocab, embedding_size=args.embedding_size,
                          hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=heads, intermediate_size=ffn,
                          hidden_act="gelu", hidden_dropout_prob=args.dropout,
                          attention_probs_dropout_prob=args.attention_dropout,
                          max_position_embeddings=args.max_position, pad_token_id=0)
        c._attn_implementation = args.attention
        return c

    generator = ElectraForMaskedLM(
        config(args.gen_hidden, args.gen_layers, args.gen_heads, args.gen_ffn))
    discriminator = ElectraForPreTraining(
        config(args.hidden, args.disc_layers, args.heads, args.ffn))
    d_emb, g_emb = discriminator.electra.embeddings, generator.electra.embeddings
    g_emb.word_embeddings = d_emb.word_embeddings
    g_emb.position_embeddings = d_emb.position_embeddings
    generator.generator_lm_head.weight = d_emb.word_embeddings.weight
    generator.to(device).train()
    discriminator.to(device).train()

    # The encoders see fixed [B, S] shapes; the heads at the masked positions stay eager (their
    # row count changes every step).
    generator_encoder = torch.compile(generator.electra) if args.compile else generator.electra
    discriminator_forward = torch.compile(discriminator) if args.compile else discriminator
    params = list({id(p): p for m in (generator, discriminator) for p in m.parameters()}.values())
    optimizer = torch.optim.AdamW(params, lr=5e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01,
                                  **({"fused": True} if args.fused_adam else {}))
    B, S, V = args.batch, args.seq, args.vocab
    n_mask = max(1, round(args.mask_prob * S))
    rng = torch.Generator(device=device).manual_seed(args.seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=not args.fp32)
    columns = torch.arange(S, device=device)

    def mask_positions():
        """[B, S] bool: the positions the generator predicts."""
        scores = torch.rand((B, S), generator=rng, device=device)
        if not args.xlme_masking:
            positions = scores.topk(n_mask, dim=1).indices
            return torch.zeros((B, S), dtype=torch.bool, device=device).scatter_(1, positions, True)
        # xlme: k = floor(p * (S - 2) + u) of the inner positions, chosen uniformly: the k
        # lowest scores, with <s> and </s> scored above every inner position.
        scores[:, 0] = scores[:, -1] = 2.0
        k = (args.mask_prob * (S - 2) + torch.rand((B, 1), generator=rng, device=device)).floor()
        return torch.zeros((B, S), dtype=torch.bool, device=device).scatter_(
            1, scores.argsort(dim=1), columns < k)

    def step():
        ids = torch.randint(FIRST_REAL_ID, V, (B, S), generator=rng, device=device)
        masked = mask_positions()
        originals = ids[masked]  # [N]
        generator_input = ids.masked_fill(masked, MASK_ID)
        with autocast:
            if args.masked_only_head:
                hidden = generator_encoder(input_ids=generator_input).last_hidden_state
                head = generator.generator_predictions(hidden[masked])  # [N, E]
                logits = generator.generator_lm_head(head)
                mlm = F.cross_entropy(logits.float(), originals)
            else:
                labels = torch.full((B, S), -100, dtype=torch.long, device=device)
                out = generator(input_ids=generator_input,
                                labels=labels.masked_scatter_(masked, originals))
                mlm, logits = out.loss, out.logits[masked]  # logits: [N, V]
            with torch.no_grad():
                u = torch.rand(logits.shape, generator=rng, device=device).clamp_(1e-10, 1 - 1e-7)
                sampled = (logits.float() - torch.log(-torch.log(u))).argmax(dim=-1)
                corrupted = ids.masked_scatter(masked, sampled)
                labels = (corrupted != ids).float()
            rtd_logits = discriminator_forward(input_ids=corrupted).logits
            rtd = F.binary_cross_entropy_with_logits(rtd_logits.float(), labels)
            loss = mlm + args.rtd_weight * rtd
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        optimizer.step()
        return loss, originals.numel()

    for _ in range(args.warmup_steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, masked_counts = [], []
    load_before = os.getloadavg()[0]
    ticks_before = cpu_ticks()
    cpu_before = time.process_time()
    start = time.perf_counter()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss, n = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
        masked_counts.append(n)
    elapsed = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_before
    ticks_after = cpu_ticks()
    steal = None
    if ticks_before and ticks_after and ticks_after[1] > ticks_before[1]:
        steal = (ticks_after[0] - ticks_before[0]) / (ticks_after[1] - ticks_before[1])
    result = {
        "bench": "peer_hf_electra",
        "tokens_per_s": B * S * args.steps / elapsed,
        "ms_per_step": statistics.median(times),
        "ms_per_step_min": min(times),
        "ms_per_step_max": max(times),
        "elapsed_s": elapsed,
        "tokens_per_step": B * S,
        "masked_per_step": statistics.fmean(masked_counts),
        "last_loss": float(loss.detach()),
        "peak_memory_mib": (torch.cuda.max_memory_allocated() / 2**20
                            if device.type == "cuda" else None),
        "params": sum(p.numel() for p in params),
        "precision": "fp32" if args.fp32 else "bf16-autocast",
        "attention": getattr(discriminator.config, "_attn_implementation", args.attention),
        "fused_adam": args.fused_adam,
        "compiled": args.compile,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpu_model": cpu_model(),
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        # Contention: the 1-minute load when timing began (this process's warm-up included), the
        # process's CPU seconds per wall second while timed (well below the threads: it did not get
        # the cores), and the share of all CPU time the hypervisor stole meanwhile (0 on bare
        # metal; repeat runs above ~0.05).
        "loadavg_1m_before": load_before,
        "cpu_s_per_wall_s": cpu_seconds / elapsed,
        "steal_frac": steal,
        "config": vars(args),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
