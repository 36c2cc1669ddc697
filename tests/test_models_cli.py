"""`python -m vit_jax.models [NAME]`: the registry's models, one model's settings and its
parameter count; flags that do not apply, or are out of range, are a usage line."""

import pytest

from vit_jax.models import __main__ as models_cli


def test_a_model_lists_its_settings_and_counts_its_parameters(capsys):
  assert models_cli.main(['ViT-B_16']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert "  --config.model.hidden_size=768" in lines
  assert lines[-1] == '86,567,656 parameters (224x224 input, 1000 classes)'
  assert models_cli.main(['ViT-B_16', '--num-classes', '0']) == 0
  # The published ViT-B/16 without its 768 x 1000 head and its bias.
  assert capsys.readouterr().out.splitlines()[-1] == (
      '85,798,656 parameters (224x224 input, no head: pooled features)')
  assert models_cli.main(['Transformer-testing', '--vocab-size', '100']) == 0
  assert capsys.readouterr().out.splitlines()[-1].endswith(' parameters (vocabulary 100)')


@pytest.mark.parametrize('argv, said', [
    (['ViT-B_16', '--image-size', '0'], 'invalid --image-size 0 (expected an integer >= 1)'),
    (['ViT-B_16', '--num-classes', '-5'], 'invalid --num-classes -5 (expected an integer >= 0)'),
    (['Transformer-base', '--vocab-size', '0'],
     'invalid --vocab-size 0 (expected an integer >= 1)'),
    (['Transformer-base', '--image-size', '224'],
     '--image-size does not apply to Transformer-base, a Transformer: its count takes '
     '--vocab-size'),
    (['ViT-B_16', '--vocab-size', '10'],
     '--vocab-size does not apply to ViT-B_16, a ViT: its count takes --image-size and '
     '--num-classes'),
    (['--vocab-size', '5'], '--vocab-size applies to the parameter count of one model: name it, '
     'e.g. Transformer-base --vocab-size 5')])
def test_a_flag_out_of_range_or_of_the_other_family_is_a_usage_line(capsys, argv, said):
  with pytest.raises(SystemExit):
    models_cli.main(argv)
  assert capsys.readouterr().err.splitlines()[-1] == f'python -m vit_jax.models: error: {said}'


def test_an_unknown_model_is_one_line(capsys):
  assert models_cli.main(['ViT-Nope', '--image-size', '32']) == 1
  assert capsys.readouterr().err.startswith("error: Unknown model 'ViT-Nope'. Known models: ")
