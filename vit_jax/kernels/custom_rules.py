"""custom_vjp rules for kernels that run undifferentiated only: differentiated, the layer
is computed as the model's reference code computes it, with its gradient."""

import jax


def vjp_of_perturbed(layer, *primals):
  """A custom_vjp forward rule (symbolic zeros): `layer`'s output, and residuals for the
  gradients of the inputs being differentiated only, so that no unused gradient (the
  images' in a train step) is traced."""
  values = [p.value for p in primals]
  perturbed = [p.perturbed for p in primals]

  def of_perturbed(*differentiated):
    given = iter(differentiated)
    return layer(*(next(given) if d else v for v, d in zip(values, perturbed)))
  out, pullback = jax.vjp(of_perturbed, *(v for v, d in zip(values, perturbed) if d))
  return out, (pullback, tuple(() if d else None for d in perturbed))


def cotangents(residuals, d_out):
  """The backward rule to `vjp_of_perturbed`: None (zero) for the inputs not differentiated."""
  pullback, differentiated = residuals
  given = iter(pullback(d_out))
  return tuple(None if d is None else next(given) for d in differentiated)
