"""Speed, FLOP/s, MFU and memory of the models, optionally side by side with timm.

  python -m vit_jax.benchmark --model ViT-B_16 --mode infer --batch 8 --resolution 224 \\
      --dtype float32 [--steps 20] [--warmup 3] [--compare timm] [--json out.json] \\
      [--peak-tflops X] [--attention auto|fused|plain|chunked|blas] [--scan-layers] [--remat] \\
      [--no-tune-malloc] [--timm-path DIR] [--xla-option NAME=VALUE ...] [--matmul auto|xla|blas]
  python -m vit_jax.benchmark --model ViT-S_16 --mode train --batch 16 --compare timm
  python -m vit_jax.benchmark --model Transformer-base --mode seq2seq [--seq-len 64] \\
      [--decode-length 64] [--vocab-size 32000]
  python -m vit_jax.benchmark --attention-memory [--resolutions 256,512,768,1024]
  python -m vit_jax.benchmark --compile-depth

Modes:
  infer    jitted forward pass (eval mode) on random images.
  train    one real optimizer step: the trainer's `make_train_step` over the classification
           task's loss, with AdamW from `optim.make_optimizer` (gradient clipping on),
           jitted with the state donated.
  seq2seq  Transformer training tokens/s (target tokens; the translation task's loss), and
           greedy decoding tokens/s with the key/value cache and without it (the whole
           decoder re-run for every new token); each decode includes encoding the source once.
  --attention-memory  ViT forward (batch 1) memory per attention path at growing
           token counts, from XLA's compiled memory analysis (deterministic: the
           buffers XLA allocates; nothing is run).
  --compile-depth  compile time of a deep model with `scan_layers` against a 4-layer
           model of the same width (and the deep model unrolled).

One module per job: `cli` (flags, the run, the title line), `steps` (what a step runs),
`timing` (timed, compiled steps; FLOP/s and MFU), `memory`, `vit` (infer and train),
`timm_runner` (--compare timm), `seq2seq`, `compile_depth` and `report` (the tables).
"""
