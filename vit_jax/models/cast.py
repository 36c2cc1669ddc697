"""Params stored in the dtype the model casts them to, for inference.

A Flax layer with `dtype=bfloat16` keeps its params in float32 and casts them to bfloat16 at
every call (`Dense`, `Conv`, `Embed`, the position embedding); a LayerNorm uses its scale and
bias in float32. An inference step that takes float32 params converts each weight matrix on
every call. `cast_as_used` finds, from the traced function, the params whose every use is a
cast to one narrower floating dtype, and casts those once, ahead: the function then computes
the same numbers from params half the size.
"""

from typing import Any, Callable

import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import numpy as np

# Primitives whose output is their first operand rearranged: a cast commutes with them.
_REARRANGING = frozenset({'reshape', 'squeeze', 'expand_dims', 'transpose'})
_AS_IS = object()  # A use of the value in its own dtype.


def _inner(eqn) -> list[tuple[Any, list]]:
  """[(jaxpr, its invars matching eqn.invars)] of a call-like `eqn`, [] for other primitives."""
  if eqn.primitive.name == 'cond':  # invars: the branch index, then the branches' operands.
    return [(branch.jaxpr, [None] + list(branch.jaxpr.invars))
            for branch in eqn.params['branches']]
  for name in ('jaxpr', 'call_jaxpr', 'fun_jaxpr'):
    inner = eqn.params.get(name)
    inner = getattr(inner, 'jaxpr', inner)
    if hasattr(inner, 'invars') and len(inner.invars) == len(eqn.invars):
      return [(inner, list(inner.invars))]  # jit, remat, custom_jvp/vjp, scan: one to one.
  return []


def _collect_uses(jaxpr, tracked: dict, uses: list[set]) -> None:
  """Adds to uses[i] the dtype of each cast of the vars tracked[var] == i (_AS_IS otherwise)."""
  for eqn in jaxpr.eqns:
    operands = [(position, tracked[var]) for position, var in enumerate(eqn.invars)
                if not isinstance(var, jax_core.Literal) and var in tracked]
    if not operands:
      continue
    name = eqn.primitive.name
    if name == 'convert_element_type':
      uses[operands[0][1]].add(np.dtype(eqn.params['new_dtype']))
    elif name in _REARRANGING and [p for p, _ in operands] == [0]:
      tracked = {**tracked, eqn.outvars[0]: operands[0][1]}
    elif inner := _inner(eqn):
      for sub_jaxpr, sub_invars in inner:
        _collect_uses(sub_jaxpr, {sub_invars[p]: i for p, i in operands
                                  if sub_invars[p] is not None}, uses)
      for position, i in operands:
        if inner[0][1][position] is None:  # A cond's branch index.
          uses[i].add(_AS_IS)
    else:
      for _, i in operands:
        uses[i].add(_AS_IS)
  for var in jaxpr.outvars:
    if not isinstance(var, jax_core.Literal) and var in tracked:
      uses[tracked[var]].add(_AS_IS)


def cast_as_used(fn: Callable, params: Any, *args: Any) -> Any:
  """`params` with each floating leaf that `fn(params, *args)` only ever casts to one
  narrower floating dtype stored in that dtype; the other leaves as they are.

  `args` may be arrays or `jax.ShapeDtypeStruct`s: `fn` is traced, not run.
  """
  leaves, treedef = jax.tree.flatten(params)
  closed = jax.make_jaxpr(lambda flat, *rest: fn(jax.tree.unflatten(treedef, flat), *rest))(
      leaves, *args)
  uses = [set() for _ in leaves]
  _collect_uses(closed.jaxpr, {var: i for i, var in enumerate(closed.jaxpr.invars[:len(leaves)])},
                uses)
  cast = []
  for leaf, leaf_uses in zip(leaves, uses):
    dtype = np.dtype(leaf.dtype)
    if (len(leaf_uses) == 1 and (target := next(iter(leaf_uses))) is not _AS_IS
        and jnp.issubdtype(dtype, np.floating) and jnp.issubdtype(target, np.floating)
        and target.itemsize < dtype.itemsize):
      leaf = leaf.astype(target)
    cast.append(leaf)
  return jax.tree.unflatten(treedef, cast)
