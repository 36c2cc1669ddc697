"""The Colab notebooks run top to bottom, headless, with tiny parameters (any cell error fails)."""

import os

import nbclient
import nbformat
import pytest
from helpers import NATIVE_WARNING

COLAB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'colab')


def run_notebook(name: str, parameters: dict, cwd: str) -> nbformat.NotebookNode:
  """Executes colab/`name` in `cwd` with `parameters` injected after its `parameters` cell."""
  notebook = nbformat.read(os.path.join(COLAB, name), as_version=4)
  tagged = [i for i, cell in enumerate(notebook.cells)
            if 'parameters' in cell.metadata.get('tags', [])]
  assert len(tagged) == 1, f'{name} needs exactly one cell tagged "parameters"'
  injected = nbformat.v4.new_code_cell('\n'.join(f'{k} = {v!r}' for k, v in parameters.items()))
  injected.metadata['tags'] = ['injected-parameters']
  notebook.cells.insert(tagged[0] + 1, injected)
  client = nbclient.NotebookClient(notebook, timeout=300, kernel_name='python3',
                                   resources={'metadata': {'path': cwd}})
  client.execute()  # Raises CellExecutionError, with the traceback, on any cell error.
  return notebook


def _image_outputs(notebook) -> int:
  return sum('image/png' in output.get('data', {})
             for cell in notebook.cells if cell.cell_type == 'code' for output in cell.outputs)


def _text(notebook) -> str:
  return ''.join(output.get('text', '') for cell in notebook.cells
                 if cell.cell_type == 'code' for output in cell.outputs)


def _assert_no_native_warnings(notebook):
  """No cell printed a warning line of TensorFlow's or XLA's C++ logging."""
  assert not NATIVE_WARNING.search(_text(notebook)), _text(notebook)


@pytest.mark.parametrize('name', ['vit_jax.ipynb', 'transformer.ipynb'])
def test_notebook_cells_are_clean(name):
  notebook = nbformat.read(os.path.join(COLAB, name), as_version=4)
  nbformat.validate(notebook)
  # Committed without outputs, so that they show what runs, not a stale run.
  assert all(not cell.get('outputs') for cell in notebook.cells if cell.cell_type == 'code')


def test_vit_notebook_runs_headless(tmp_path):
  notebook = run_notebook('vit_jax.ipynb', {'TRAIN_STEPS': 10, 'NUM_IMAGES': 2}, str(tmp_path))
  # Top-5 bars, training curves and two attention-map figures.
  assert _image_outputs(notebook) == 4
  assert 'test accuracy' in _text(notebook)
  _assert_no_native_warnings(notebook)
  assert os.path.exists(tmp_path / 'runs' / 'digits_notebook' / 'metrics.jsonl')


def test_transformer_notebook_runs_headless(tmp_path):
  notebook = run_notebook('transformer.ipynb',
                          {'TRAIN_STEPS': 10, 'SENTENCES': ['March 3, 2021', '1 mai 1999'],
                           'BEAM_SIZE': 2, 'NUM_EVAL_DECODE': 16}, str(tmp_path))
  # Training curves and one cross-attention heat map per sentence.
  assert _image_outputs(notebook) == 3
  assert "'March 3, 2021'" in _text(notebook) and 'beam 2' in _text(notebook)
  _assert_no_native_warnings(notebook)
