#!/usr/bin/env python3
"""Write a random-weight Llama of a chosen shape with save_pretrained (nothing is downloaded),
for the real-server benchmark at a realistic size (docs: benchmarks/README.md).

    python3 benchmarks/make_llama.py OUT_DIR --shape 1b
"""

from __future__ import annotations

import argparse
import sys

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate
    "1b": (2048, 16, 32, 8, 8192),
    "3b": (3072, 28, 24, 8, 8192),
    "8b": (4096, 32, 32, 8, 14336),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv, inter = SHAPES[args.shape]
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv,
                      head_dim=hidden // heads, vocab_size=args.vocab,
                      max_position_embeddings=8192, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(args.seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"wrote a random {args.shape}-shape Llama to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
