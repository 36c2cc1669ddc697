"""What a compiled program's kernels must move and compute: a roofline from its HLO.

`kernels(hlo_text)` reads the optimised HLO of a compiled function (`compiled.as_text()`)
and lists the kernels its entry computation launches (while-loop bodies counted once per
trip, as XLA knows the trip count of a scan): fusions, library calls (cuBLAS, cuDNN) and
standalone ops. For each:

- bytes: its operands read once and its outputs written once (a library call's scratch
  workspace not counted; a fusion's operand that it only slices, the slices), the least
  memory traffic the kernel can have;
- FLOPs: 2 per multiply-add of its matrix products (a dot, a convolution, or a dot inside
  a GEMM fusion) and, for cuDNN's flash attention, of the products it executes (forward:
  q k^T and p v; backward: five, q k^T recomputed).

`summarise` adds them up by category (the names of `trace.CATEGORIES`) and bounds each
kernel's time by max(FLOPs / peak, bytes / bandwidth): no schedule of this program runs
faster than the sum, so the step's MFU can be no higher than its bound. Comparing the
categories with a profile (`--trace`) says which kernels are far from their bound.
"""

import collections
import dataclasses
import math
import re
import sys

from vit_jax import entry

DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2, 'bf16': 2,
               's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8, 'f64': 8,
               'f8e4m3fn': 1, 'f8e5m2': 1}
_ARRAY = re.compile(r'\b(' + '|'.join(DTYPE_BYTES) + r')\[([0-9,]*)\]')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$')
_COMPUTATION = re.compile(r'^(ENTRY )?%([\w.\-]+) .*\{$')
_CUSTOM_CALL_TARGET = re.compile(r'custom_call_target="([^"]*)"')
# Ops that launch nothing: they name or rearrange buffers.
_NO_KERNEL = {'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast', 'after-all',
              'partition-id', 'replica-id', 'opt-barrier', 'add-dependency'}
_MATMUL_TARGETS = re.compile(r'cublas|gemm|matmul|\$conv|blas', re.IGNORECASE)


@dataclasses.dataclass
class Kernel:
  name: str
  category: str
  bytes: int
  flops: int
  calls: int = 1  # Launches per step (a while body's kernels: its trip count).


def _arrays(shape_text: str) -> list[tuple[str, list[int]]]:
  """[(dtype, dims)] of every array in an HLO shape (a tuple lists several)."""
  return [(dtype, [int(d) for d in dims.split(',') if d])
          for dtype, dims in _ARRAY.findall(shape_text)]


def _size(arrays) -> int:
  return sum(DTYPE_BYTES[dtype] * math.prod(dims) for dtype, dims in arrays)


def _dims_attr(text: str, name: str) -> list[int]:
  """`lhs_contracting_dims={1,2}` or JSON `"lhs_contracting_dimensions":["1"]` -> [1, 2]."""
  match = (re.search(name + r'_dims=\{([0-9,]*)\}', text)
           or re.search(r'"' + name + r'_dimensions":\s*\[([^\]]*)\]', text))
  return [int(d) for d in re.findall(r'\d+', match.group(1))] if match else []


def _dot_flops(line: str, out_arrays, operand_dims: list[list[int]]) -> int:
  """2 x output elements x contracted size, for a dot or a GEMM library call."""
  if not operand_dims or not out_arrays:
    return 0
  lhs, out = operand_dims[0], math.prod(out_arrays[0][1])
  dims = _dims_attr(line, 'lhs_contracting')
  if dims:
    contracted = math.prod(lhs[d] for d in dims if d < len(lhs))
  elif len(operand_dims) >= 2:  # A product without dimension numbers (our BLAS call):
    # (M x K) (K x N) / (M x N) = K^2, whichever operand is transposed.
    contracted = round(math.sqrt(math.prod(lhs) * math.prod(operand_dims[1]) / max(out, 1)))
  else:
    contracted = 1
  return 2 * out * contracted


def _conv_flops(line: str, out_arrays, operand_dims: list[list[int]]) -> int:
  """2 x output elements x (input features x window) per output, from dim_labels."""
  labels = re.search(r'dim_labels=(\w+)_(\w+)->(\w+)', line)
  if not labels or len(operand_dims) < 2 or not out_arrays:
    return 0
  kernel_labels, kernel = labels.group(2), operand_dims[1]
  per_output = math.prod(size for label, size in zip(kernel_labels, kernel) if label != 'o')
  return 2 * math.prod(out_arrays[0][1]) * per_output


def _attention_flops(line: str, target: str, operand_dims: list[list[int]]) -> int:
  """cuDNN flash attention: 2 products forward, 5 backward, each B x N x T x S x head_dim.

  The (B, N, T, S) scores are cuDNN's `intermediate_tensor_shape`; head_dim is the last
  dim of q in either of its layouts.
  """
  scores = re.search(r'"intermediate_tensor_shape":\s*\{[^}]*?"dimensions":\s*\[([^\]]*)\]', line)
  if not scores or not operand_dims:
    return 0
  products = 5 if 'backward' in target.lower() else 2
  score_elements = math.prod(int(d) for d in re.findall(r'\d+', scores.group(1)))
  return 2 * products * score_elements * operand_dims[0][-1]


def _category(op: str, target: str) -> str:
  if 'fmha' in target or 'attention' in target:
    return 'attention'
  if op in ('dot', 'convolution') or _MATMUL_TARGETS.search(target):
    return 'matmul'
  if op in ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute') \
      or op.endswith('-start'):
    return 'collective'
  if op in ('copy', 'transpose', 'dynamic-update-slice', 'pad', 'slice', 'concatenate'):
    return 'copy/transpose'
  if op == 'fusion' or op in ('reduce', 'broadcast', 'convert', 'select') or target:
    return 'fusion (elementwise/reduce)'
  return 'other'


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
  """({name: instruction lines}, entry name) of an HLO module's text."""
  computations, current, entry = {}, None, None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header:
      current = header.group(2)
      computations[current] = []
      if header.group(1):
        entry = current
    elif line.startswith('}'):
      current = None
    elif current is not None:
      computations[current].append(line)
  if entry is None:
    raise ValueError('No ENTRY computation in this HLO text.')
  return computations, entry


def _fused_product(lines: list[str], computations: dict) -> int:
  """FLOPs of the dots and convolutions inside a fusion (and fusions nested in it)."""
  shapes, flops = {}, 0
  for line in lines:
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, shape, op, rest = match.groups()
    shapes[name] = _arrays(shape)
    operand_dims = [shapes[o][0][1] for o in re.findall(r'%([\w.\-]+)', rest.split(')')[0])
                    if shapes.get(o)]
    if op == 'dot':
      flops += _dot_flops(line, shapes[name], operand_dims)
    elif op == 'convolution':
      flops += _conv_flops(line, shapes[name], operand_dims)
    elif op == 'fusion':
      callee = re.search(r'calls=%([\w.\-]+)', line)
      if callee and callee.group(1) in computations:
        flops += _fused_product(computations[callee.group(1)], computations)
  return flops


def _sliced_reads(lines: list[str]) -> dict[int, int]:
  """{parameter number: bytes} of a fused computation's parameters read only through slices.

  XLA merges products that share an input (a decoder's cross-attention keys and values
  of every layer: one product) and each consumer fusion slices its part of the output.
  """
  parameters, users, shapes = {}, {}, {}
  for line in lines:
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, shape, op, rest = match.groups()
    shapes[name] = (op, _arrays(shape))
    if op == 'parameter':
      parameters[name] = int(re.match(r'(\d+)\)', rest).group(1))
      continue
    for operand in re.findall(r'%([\w.\-]+)', rest.split(')')[0]):
      users.setdefault(operand, []).append(name)

  def slice_bytes(name):  # Bytes read through slices, or None where read whole.
    total = 0
    for user in users.get(name, []):
      op, arrays = shapes[user]
      if op in ('slice', 'dynamic-slice'):
        total += _size(arrays)
      elif op == 'bitcast':
        inner = slice_bytes(user)
        if inner is None:
          return None
        total += inner
      else:
        return None
    return total

  sliced = {}
  for name, number in parameters.items():
    read = slice_bytes(name)
    if read is not None and users.get(name):
      sliced[number] = min(read, _size(shapes[name][1]))
  return sliced


def custom_call_targets(hlo_text: str) -> dict[str, str]:
  """{instruction name: target} of the custom calls in an optimised HLO text, all computations."""
  targets = {}
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    target = _CUSTOM_CALL_TARGET.search(line) if match and match.group(3) == 'custom-call' else None
    if target:
      targets[match.group(1)] = target.group(1)
  return targets


def kernels(hlo_text: str) -> list[Kernel]:
  """The kernels of the entry computation of an optimised HLO module, in program order."""
  computations, entry = _computations(hlo_text)
  found: list[Kernel] = []

  def walk(name: str, calls: int):
    shapes = {}
    for line in computations.get(name, []):
      match = _INSTRUCTION.match(line)
      if not match:
        continue
      result, shape, op, rest = match.groups()
      shapes[result] = _arrays(shape)
      if op in _NO_KERNEL:
        continue
      operands = re.findall(r'%([\w.\-]+)', rest.split(')')[0])
      if op == 'while':
        trips = re.search(r'"known_trip_count":\s*\{\s*"n":\s*"(\d+)"', line)
        body = re.search(r'body=%([\w.\-]+)', line)
        if body:
          walk(body.group(1), calls * (int(trips.group(1)) if trips else 1))
        continue
      if op == 'call':
        callee = re.search(r'to_apply=%([\w.\-]+)', line)
        if callee:
          walk(callee.group(1), calls)
        continue
      target = _CUSTOM_CALL_TARGET.search(line)
      target = target.group(1) if target else ''
      outputs = shapes[result]
      if op == 'custom-call':  # A library call's scratch space is not data.
        outputs = [a for a in outputs if a[0] not in ('u8', 's8')] or outputs[:1]
      operand_dims = [shapes[o][0][1] for o in operands if shapes.get(o)]
      fusion_kind = re.search(r'"kind":\s*"(__\w+)"', line) if op == 'fusion' else None
      if fusion_kind:
        target = fusion_kind.group(1)
      category = _category(op, target)
      reads = [_size(shapes[o]) for o in operands if o in shapes]
      flops = 0
      if category == 'attention':
        flops = _attention_flops(line, target, operand_dims)
      elif op == 'dot' or (op == 'custom-call' and category == 'matmul' and 'conv' not in target):
        flops = _dot_flops(line, outputs, operand_dims)
      elif op == 'convolution' or 'conv' in target:
        flops = _conv_flops(line, outputs, operand_dims)
      elif op == 'fusion':
        callee = re.search(r'calls=%([\w.\-]+)', line)
        fused = computations.get(callee.group(1), []) if callee else []
        flops = _fused_product(fused, computations)
        if flops and category != 'attention':
          category = 'matmul'
        if len(reads) == len(operands):
          for number, read in _sliced_reads(fused).items():
            if number < len(reads):
              reads[number] = read
      found.append(Kernel(result, category, _size(outputs) + sum(reads), flops, calls))

  walk(entry, 1)
  return found


def summarise(found: list[Kernel], peak_tflops: float, bandwidth_gbs: float,
              model_flops: float | None = None) -> dict:
  """Kernels, GB, TFLOP and bound ms by category; the step's bound and its MFU bound.

  Each kernel takes at least max(flops / peak, bytes / bandwidth). `model_flops` (2 x the
  model's multiply-adds) gives the MFU no schedule of this program can beat.
  """
  rows = collections.defaultdict(lambda: {'kernels': 0, 'bytes': 0, 'flops': 0, 'bound_s': 0.0})
  for kernel in found:
    row = rows[kernel.category]
    row['kernels'] += kernel.calls
    row['bytes'] += kernel.bytes * kernel.calls
    row['flops'] += kernel.flops * kernel.calls
    row['bound_s'] += kernel.calls * max(kernel.flops / (peak_tflops * 1e12),
                                         kernel.bytes / (bandwidth_gbs * 1e9))
  categories = [{'name': name, **row} for name, row in
                sorted(rows.items(), key=lambda item: -item[1]['bound_s'])]
  bound_s = sum(row['bound_s'] for row in categories)
  result = {'peak_tflops': peak_tflops, 'bandwidth_gbs': bandwidth_gbs,
            'categories': categories, 'bound_s': bound_s,
            'kernels': sum(row['kernels'] for row in categories),
            'flops': sum(row['flops'] for row in categories),
            'bytes': sum(row['bytes'] for row in categories)}
  if model_flops:
    result['model_flops'] = model_flops
    result['mfu_bound'] = model_flops / bound_s / (peak_tflops * 1e12) if bound_s else None
  return result


def format_summary(summary: dict) -> str:
  """The category table, then the bound and what it means."""
  header = (f'{"kernels by category":30s} {"kernels":>8s} {"GB moved":>9s} {"TFLOP":>8s} '
            f'{"bound (ms)":>11s}')
  lines = [header, '-' * len(header)]
  for row in summary['categories'] + [{'name': 'all', **{k: summary[k] for k in (
      'kernels', 'bytes', 'flops', 'bound_s')}}]:
    lines.append(f'{row["name"]:30s} {row["kernels"]:8d} {row["bytes"] / 1e9:9.2f} '
                 f'{row["flops"] / 1e12:8.3f} {1e3 * row["bound_s"]:11.2f}')
  text = (f'bound: each kernel at max(FLOPs / {summary["peak_tflops"]:g} TFLOP/s, bytes / '
          f'{summary["bandwidth_gbs"]:g} GB/s)')
  if summary.get('mfu_bound') is not None:
    text += (f'; with the model\'s {summary["model_flops"] / 1e12:.3f} TFLOP a step, MFU '
             f'cannot exceed {100 * summary["mfu_bound"]:.1f}%')
  return '\n'.join(lines + [text])


def main(argv=None) -> int:
  """`python -m vit_jax.benchmark.hlo_costs FILE`: the table of an HLO file (`--hlo-out`)."""
  import argparse  # pylint: disable=g-import-not-at-top
  from vit_jax.benchmark import gpu_target  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog='python -m vit_jax.benchmark.hlo_costs',
                                   description=__doc__.split('\n')[0])
  parser.add_argument('hlo', help='optimised HLO text, as --hlo-out writes it')
  parser.add_argument('--target', default='h200', choices=tuple(gpu_target.TARGETS),
                      help='the GPU whose peak and bandwidth bound the kernels')
  parser.add_argument('--dtype', default='bfloat16', choices=('bfloat16', 'float32'),
                      help="the products' dtype, for the peak")
  parser.add_argument('--model-tflop', type=float, help="the model's TFLOP a step, for the MFU "
                      'bound (the benchmark prints its GMACs / step: TFLOP = 2 x GMACs / 1000)')
  args = parser.parse_args(argv)
  if args.model_tflop is not None and not args.model_tflop > 0:
    parser.error(f'invalid --model-tflop {args.model_tflop:g} (expected a number > 0, e.g. 13.459 '
                 'for a ViT-B/16 train step at batch 128)')
  target = gpu_target.TARGETS[args.target]
  try:
    with open(args.hlo) as f:
      found = kernels(f.read())
  except (OSError, ValueError) as error:
    print(f'error: cannot read the kernels of {args.hlo}: {error}', file=sys.stderr)
    return 1
  peak = target.peak_tflops(args.dtype)
  model_flops = args.model_tflop * 1e12 if args.model_tflop is not None else None
  print(format_summary(summarise(found, peak, target.memory_bandwidth_gbs, model_flops)))
  return 0


if __name__ == '__main__':
  entry.run(main)
