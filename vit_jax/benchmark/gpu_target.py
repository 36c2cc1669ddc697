"""`--compile-for h200`: our step compiled for a GPU that is not on this machine.

XLA compiles for a described GPU without one: JAX's CUDA plugin makes a compile-only
device from a target config (the chip's multiprocessors, memory bandwidth, caches,
compute capability and cuDNN version, `TARGETS`), and the step is lowered and compiled
for it exactly as on the GPU, cuDNN attention and cuBLAS calls included. What is left out
is autotuning, which needs the GPU: every product goes to cuBLAS (`xla_gpu_enable_triton_gemm`
off), where on the GPU the autotuner may give some to Triton. The program's kernels are
summarised by `hlo_costs`; its buffers by XLA's memory analysis.

Needs the CUDA plugin of this jaxlib (no GPU, no CUDA libraries):
`pip install jax-cuda12-plugin==V jax-cuda12-pjrt==V` with V the jaxlib version.
"""

import contextlib
import dataclasses
import importlib
import os
import pkgutil
import time
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib

from vit_jax import errors, files, models, native_logs
from vit_jax.benchmark import hlo_costs, memory, steps, timing
from vit_jax.flops import count_flops
from vit_jax.models import backend


@dataclasses.dataclass(frozen=True)
class Target:
  """A GPU by its datasheet: what XLA's target config and the roofline need."""
  device_name: str
  multiprocessors: int
  memory_bandwidth_gbs: float
  memory_bytes: int
  l2_cache_bytes: int
  clock_ghz: float
  compute_capability: tuple[int, int] = (9, 0)
  cudnn_version: tuple[int, int, int] = (9, 10, 0)

  def peak_tflops(self, dtype: str) -> float:
    """Dense peak TFLOP/s for `dtype`, from the benchmark's table (`timing.PEAK_TFLOPS`)."""
    return timing.device_kind_peak_tflops(self.device_name, dtype)

  def config_text(self) -> str:
    """The stream_executor.GpuTargetConfigProto XLA compiles against, as text."""
    major, minor = self.compute_capability
    cudnn_major, cudnn_minor, cudnn_patch = self.cudnn_version
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024  threads_per_warp: 32
  shared_memory_per_block: 49152  shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472  threads_per_core_limit: 2048
  core_count: {self.multiprocessors}  fpus_per_core: 128
  block_dim_limit_x: 2147483647  block_dim_limit_y: 65535  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.memory_bandwidth_gbs * 1e9)}
  l2_cache_size: {self.l2_cache_bytes}  clock_rate_ghz: {self.clock_ghz}
  device_memory_size: {self.memory_bytes}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: {cudnn_major} minor: {cudnn_minor} patch: {cudnn_patch} }}
device_description_str: "{self.device_name}"
"""


# Hopper SXM parts: 132 multiprocessors, 50 MB of L2.
TARGETS = {
    'h100': Target('NVIDIA H100 80GB HBM3', 132, 3350.0, 80 * 2**30, 50 * 2**20, 1.98),
    'h200': Target('NVIDIA H200', 132, 4800.0, 141 * 10**9, 50 * 2**20, 1.98),
}
# Options of every compile for a target: no autotuning is possible without the GPU.
COMPILER_OPTIONS = {'xla_gpu_enable_triton_gemm': False}


def start_jax():
  """Starts JAX with its CUDA plugin on a machine without CUDA, the plugin's note that there is
  no driver dropped (`native_logs`)."""
  os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  with native_logs.load_notes_dropped():
    jax.devices()


def cuda_plugin_installed() -> bool:
  """Whether JAX's CUDA plugin (for CUDA 12 or 13) is installed, GPU or not."""
  try:
    plugins = importlib.import_module('jax_plugins')
  except ModuleNotFoundError:  # No plugin of any kind.
    return False
  return any(module.name.startswith('xla_cuda')
             for module in pkgutil.iter_modules(plugins.__path__))


def compile_only_device(target: Target) -> Any:
  """A device of `target` to compile for, from JAX's CUDA plugin."""
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental import topologies
  try:
    topology = topologies.get_topology_desc(platform='cuda', topology='1x1x1',
                                            target_config=target.config_text())
  except (NotImplementedError, RuntimeError) as error:
    version = jaxlib.__version__
    raise errors.UserError(
        f'--compile-for needs JAX\'s CUDA plugin for jaxlib {version} ({error}); install it '
        f'with pip install jax-cuda12-plugin=={version} jax-cuda12-pjrt=={version} (no GPU '
        'or CUDA libraries needed).') from None
  return topology.devices[0]


@contextlib.contextmanager
def cudnn_of(target: Target):
  """`jax.nn.dot_product_attention` asks the local GPU for its compute capability and cuDNN
  version before it emits cuDNN's attention; here `target` answers."""
  # pylint: disable-next=g-import-not-at-top
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention
  names = ('check_cudnn_version', 'check_compute_capability')
  if not all(hasattr(cudnn_attention, name) for name in names):
    raise errors.UserError(f'--compile-for does not know how this JAX ({jax.__version__}) '
                           'checks cuDNN; it was written for JAX 0.10 to 0.11.')
  saved = [getattr(cudnn_attention, name) for name in names]
  major, minor, patch = target.cudnn_version
  cudnn_attention.check_cudnn_version = lambda: major * 10000 + minor * 100 + patch
  cudnn_attention.check_compute_capability = lambda capability: (
      tuple(int(x) for x in capability.split('.')) <= target.compute_capability)
  try:
    yield
  finally:
    for name, function in zip(names, saved):
      setattr(cudnn_attention, name, function)


def _step_and_inputs(args) -> tuple[Any, tuple]:
  """The benchmark's step for `args` and its inputs, as shapes (nothing is computed)."""
  if args.mode == 'seq2seq':
    model = models.get_model(args.model, vocab_size=args.vocab_size,
                             **steps.model_overrides(args))
    tokens = jax.ShapeDtypeStruct((args.batch, args.seq_len), jnp.int32)
    params = jax.eval_shape(lambda r, x: model.init(r, x, x)['params'], jax.random.PRNGKey(0),
                            tokens)
    step, tx = steps.train_step(steps.Seq2SeqTask(model), total_steps=10,
                                state_dtype=args.optimizer_state_dtype)
    batch = {'inputs': tokens, 'targets': tokens}
  else:
    model = models.get_model(args.model, num_classes=steps.NUM_CLASSES,
                             **steps.model_overrides(args))
    images = jax.ShapeDtypeStruct((args.batch, args.resolution, args.resolution, 3),
                                  jnp.float32)
    one_image = jax.ShapeDtypeStruct((1,) + images.shape[1:], images.dtype)
    params = jax.eval_shape(lambda r, x: model.init(r, x)['params'], jax.random.PRNGKey(0),
                            one_image)
    step, tx = steps.vit_step(args, model)
    if tx is None:
      return step, (params, images)
    batch = {'image': images, 'label': jax.ShapeDtypeStruct((args.batch,), jnp.int32)}
  state = jax.eval_shape(lambda p: steps.make_train_state(p, tx), params)
  return step, (state, batch, None)


def compile_for(args) -> dict:
  """Compiles the step `args` describe for `TARGETS[args.compile_for]`; its figures."""
  target = TARGETS[args.compile_for]
  device = compile_only_device(target)
  sharding = jax.sharding.SingleDeviceSharding(device)
  step, inputs = _step_and_inputs(args)
  inputs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                        inputs)
  macs = count_flops(step, *inputs)  # The model's: traced here, no padding for cuDNN.
  with backend.target_backend('gpu'), cudnn_of(target):
    start = time.perf_counter()
    donate = () if args.mode == 'infer' else 0
    lowered = jax.jit(step, donate_argnums=donate).trace(*inputs).lower(
        lowering_platforms=('cuda',))
    compiled = lowered.compile({**COMPILER_OPTIONS, **args.xla_options})
    compile_s = time.perf_counter() - start
  text = compiled.as_text()
  if args.hlo_out:
    files.write_text_atomically(args.hlo_out, text)
  peak = target.peak_tflops(args.dtype)
  summary = hlo_costs.summarise(hlo_costs.kernels(text), args.peak_tflops or peak,
                                target.memory_bandwidth_gbs, model_flops=2 * macs)
  return {'target': args.compile_for, 'device_name': target.device_name,
          'compile_s': compile_s, 'macs_per_step': macs,
          'xla_memory_analysis': memory.memory_analysis(compiled), 'hlo_costs': summary}
