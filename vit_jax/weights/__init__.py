"""Weights in and out: published ViT `.npz` checkpoints, timm `.safetensors`, orbax workdirs.

- `layout`: names and layouts of the published `.npz` format (`canonicalize`).
- `storage`: reading and writing `.npz`, `.safetensors` and orbax workdirs, local or remote.
- `fit`: fitting a checkpoint to a model (`load_pretrained`).
- `timm`: timm's state_dict names (`to_timm`, `from_timm`).
- `conversion`: whole files between formats, for `python -m vit_jax.convert`.

Orbax checkpoints of a training run are `vit_jax.train.checkpointing`.
"""

from vit_jax.weights.conversion import (FORMATS, check_against_model, convert_file, file_format,
                                        print_names, read_published)
from vit_jax.weights.fit import ShapeOnly, format_mismatches, load_pretrained, resize_posemb
from vit_jax.weights.layout import (EXTRA_TOKENS, HEAD_PREFIXES, POSEMB, PRE_LOGITS_PREFIX,
                                    STACKED_BLOCK, FlatParams, canonicalize, flatten_params,
                                    head_fields, num_prefix_tokens, posemb_side, unflatten_params,
                                    unstack_blocks)
from vit_jax.weights.storage import (load_npz, load_safetensors, read_orbax, save_npz,
                                     save_safetensors, write_orbax)
from vit_jax.weights.timm import RULES, from_timm, num_heads_of, timm_to_flat, to_timm

__all__ = [
    'EXTRA_TOKENS', 'FORMATS', 'HEAD_PREFIXES', 'POSEMB', 'PRE_LOGITS_PREFIX', 'RULES',
    'STACKED_BLOCK', 'FlatParams', 'ShapeOnly', 'canonicalize', 'check_against_model',
    'convert_file', 'file_format', 'flatten_params', 'format_mismatches', 'from_timm',
    'head_fields', 'load_npz', 'load_pretrained', 'load_safetensors', 'num_heads_of',
    'num_prefix_tokens', 'posemb_side', 'print_names', 'read_orbax', 'read_published',
    'resize_posemb', 'save_npz', 'save_safetensors', 'timm_to_flat', 'to_timm',
    'unflatten_params', 'unstack_blocks', 'write_orbax',
]
