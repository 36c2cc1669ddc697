"""The made-up parallel corpus: its files, its grammar, its split, and its mistakes."""

import pytest

from vit_jax import errors
from vit_jax.data import make_corpus


def _read(directory, name):
  return (directory / name).read_text(encoding='utf-8').splitlines()


def test_files_are_aligned_deterministic_and_the_split_is_clean(tmp_path, capsys):
  assert make_corpus.main(['--out', str(tmp_path / 'a'), '--train_pairs', '300',
                           '--test_pairs', '40']) == 0
  assert 'Wrote 300 train and 40 test sentence pairs' in capsys.readouterr().out
  make_corpus.make(str(tmp_path / 'b'), 300, 40)
  for name in ('train.src', 'train.tgt', 'test.src', 'test.tgt'):
    assert _read(tmp_path / 'a', name) == _read(tmp_path / 'b', name)
  train, test = _read(tmp_path / 'a', 'train.src'), _read(tmp_path / 'a', 'test.src')
  assert len(train) == len(_read(tmp_path / 'a', 'train.tgt')) == 300
  assert len(test) == len(set(test)) == 40
  assert not set(test) & set(train)
  other = make_corpus.pairs(300, 40, seed=1)
  assert [s for s, _ in other['train']] != train


def test_targets_follow_the_other_grammar():
  words = make_corpus.lexicon(0)
  verbs = {target: source for part in ('verb', 'transitive') for source, target in words[part]}
  nouns = {source: target for source, target in words['noun']}
  for source, target in make_corpus.pairs(200, 1, seed=0)['train']:
    last = target.split()[-1]
    plural = last.endswith('un') and last[:-2] in verbs
    verb = last[:-2] if plural else last
    assert verb in verbs, (source, target)  # The verb comes last.
    # The source verb agrees with the subject: no -s in the plural.
    source_verb = verbs[verb] + ('' if plural else 's')
    assert source_verb in source.split(), (source, target)
    if ' not ' in f' {source} ':
      assert target.split()[-2] == 'ne'
    # The subject's noun (the first noun of the source) leads the target, after its article.
    first_noun = next(w for w in source.split() if w.rstrip('s') in nouns or w in nouns)
    noun = nouns.get(first_noun) or nouns[first_noun[:-1]]
    assert target.split()[1 if target.startswith('de ') else 0].startswith(noun)


def test_mistakes_are_one_line_errors(tmp_path, capsys):
  out = str(tmp_path / 'c')
  assert make_corpus.main(['--out', out, '--train_pairs', '0']) == 1
  assert capsys.readouterr().err == 'error: --train_pairs=0: expected an integer >= 1.\n'
  assert make_corpus.main(['--out', out, '--train_pairs', '5', '--test_pairs', '2']) == 0
  assert make_corpus.main(['--out', out, '--train_pairs', '5', '--test_pairs', '2']) == 1
  assert 'train.src already exists: pass --overwrite' in capsys.readouterr().err
  assert make_corpus.main(['--out', out, '--train_pairs', '6', '--test_pairs', '2',
                           '--overwrite']) == 0
  assert len(_read(tmp_path / 'c', 'train.src')) == 6
  # A file where a folder of OUT would go: the project's one line, not Python's '[Errno 20]'.
  assert make_corpus.main(['--out', f'{out}/train.src/x', '--train_pairs', '5']) == 1
  assert capsys.readouterr().err == (f'error: Cannot write {out}/train.src/x: Not a directory; '
                                     'choose a path in a directory you can write to.\n')


def test_an_out_the_filesystem_refuses_is_a_user_error_in_python_too(tmp_path):
  (tmp_path / 'file').write_text('')
  out = f'{tmp_path}/file/corpus'
  with pytest.raises(errors.UserError, match=f'^Cannot write {out}: Not a directory; choose'):
    make_corpus.make(out, train_pairs=5, test_pairs=2)


@pytest.mark.parametrize('count', ['-3', 'many'])
def test_bad_counts_are_flag_errors(tmp_path, count, capsys):
  if count == 'many':
    with pytest.raises(SystemExit):
      make_corpus.main(['--out', str(tmp_path), '--test_pairs', count])
    assert 'invalid int value' in capsys.readouterr().err
  else:
    assert make_corpus.main(['--out', str(tmp_path), '--test_pairs', count]) == 1
