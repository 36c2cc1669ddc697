"""Command line: write a parallel corpus of a made-up language pair, for trying translation offline.

  python -m vit_jax.data.make_corpus --out=data/toy_mt [--train_pairs 29000]
      [--test_pairs 1000] [--seed 0] [--overwrite]

writes OUT/train.src, OUT/train.tgt, OUT/test.src, OUT/test.tgt, one sentence per line.
Sources are sentences of an English-like grammar over invented words: a subject, a verb
(with or without an object), prepositional phrases, adjectives, adverbs, negation, singular
and plural. Each target is its translation into a second invented language that differs
in more than its words: adjectives follow their noun, the verb goes last (after the object
and the phrases), plural nouns and verbs take endings that agree with their subject, and
negation is a particle before the verb. Both lexicons come from the seed; no test source
is also a train source. The same flags give the same files.
"""

import argparse
import os
import sys
from typing import Sequence

import numpy as np

from vit_jax import entry, errors, files

# Words of each part of speech, in both languages.
SIZES = {'noun': 2500, 'verb': 500, 'transitive': 500, 'adjective': 700, 'adverb': 120,
         'preposition': 24}
_SOURCE_SYLLABLES = ('ba be bi bo bu da de di do du fa fe fi fo ga ge go ka ke ki ko la le li '
                     'lo lu ma me mi mo mu na ne ni no nu pa pe pi po ra re ri ro ru sa se si '
                     'so ta te ti to tu va ve vi wa we wi ya yo za zo').split()
_TARGET_SYLLABLES = ('ach ber dor ein fal gen hal ich jor kan lin mor nach ob pra quel rin '
                     'sch tal uhr vel wen xor yst zan bru dro fli gro kle pla sta tre wul'
                     ).split()
SPLITS = ('train', 'test')


def _words(rng: np.random.Generator, syllables: Sequence[str], count: int,
           taken: set[str]) -> list[str]:
  """`count` distinct new words of 1-3 syllables."""
  words = []
  while len(words) < count:
    word = ''.join(rng.choice(syllables, rng.integers(1, 4)))
    if word not in taken:
      taken.add(word)
      words.append(word)
  return words


def lexicon(seed: int) -> dict[str, list[tuple[str, str]]]:
  """{part of speech: [(source word, target word), ...]} from `seed`."""
  rng = np.random.default_rng(seed)
  source_taken, target_taken = {'the', 'a', 'not', 'and'}, {'de', 'ne', 'un'}
  return {part: list(zip(_words(rng, _SOURCE_SYLLABLES, n, source_taken),
                         _words(rng, _TARGET_SYLLABLES, n, target_taken)))
          for part, n in SIZES.items()}


class _Sentence:
  """A source sentence and its translation, built phrase by phrase."""

  def __init__(self, words: dict, rng: np.random.Generator):
    self.words, self.rng = words, rng

  def pick(self, part: str) -> tuple[str, str]:
    return self.words[part][self.rng.integers(len(self.words[part]))]

  def noun_phrase(self, plural: bool) -> tuple[list[str], list[str]]:
    """'the big old dog+s' -> 'de dog+en big old': adjectives after the noun."""
    noun_source, noun_target = self.pick('noun')
    adjectives = [self.pick('adjective') for _ in range(self.rng.choice(3, p=[.5, .35, .15]))]
    article = self.rng.random() < 0.7
    source = (['the'] if article else []) + [a for a, _ in adjectives]
    source.append(noun_source + ('s' if plural else ''))
    target = (['de'] if article else []) + [noun_target + ('en' if plural else '')]
    return source, target + [t for _, t in adjectives]

  def make(self) -> tuple[str, str]:
    plural = self.rng.random() < 0.4
    subject_source, subject_target = self.noun_phrase(plural)
    transitive = self.rng.random() < 0.6
    verb_source, verb_target = self.pick('transitive' if transitive else 'verb')
    negated = self.rng.random() < 0.2
    source = subject_source + (['not'] if negated else [])
    source.append(verb_source + ('' if plural else 's'))
    middle = []  # Target: everything between the subject and the verb.
    if transitive:
      object_source, object_target = self.noun_phrase(self.rng.random() < 0.4)
      source += object_source
      middle += object_target
    for _ in range(self.rng.choice(3, p=[.45, .4, .15])):
      preposition_source, preposition_target = self.pick('preposition')
      phrase_source, phrase_target = self.noun_phrase(self.rng.random() < 0.4)
      source += [preposition_source] + phrase_source
      middle += [preposition_target] + phrase_target
    if self.rng.random() < 0.3:
      adverb_source, adverb_target = self.pick('adverb')
      source.append(adverb_source)
      middle.insert(0, adverb_target)
    target = subject_target + middle + (['ne'] if negated else [])
    target.append(verb_target + ('un' if plural else ''))
    return ' '.join(source), ' '.join(target)


def pairs(train_pairs: int, test_pairs: int, seed: int) -> dict[str, list[tuple[str, str]]]:
  """{'train', 'test'}: (source, target) pairs; no test source is also a train source."""
  words = lexicon(seed)
  sentence = _Sentence(words, np.random.default_rng(seed + 1))
  test = dict(sentence.make() for _ in range(test_pairs * 2))
  test = list(test.items())[:test_pairs]
  seen = {source for source, _ in test}
  train = []
  while len(train) < train_pairs:
    source, target = sentence.make()
    if source not in seen:
      train.append((source, target))
  return {'train': train, 'test': test}


def make(out: str, train_pairs: int = 29_000, test_pairs: int = 1_000, seed: int = 0,
         overwrite: bool = False) -> list[str]:
  """Writes the four files and returns their paths; a bad value, or an OUT the filesystem
  refuses (a file in its path, no access, a full disk), raises a UserError."""
  for name, value in (('train_pairs', train_pairs), ('test_pairs', test_pairs)):
    if value < 1:
      raise errors.ConfigError(f'--{name}={value}: expected an integer >= 1.')
  paths = [os.path.join(out, f'{split}.{side}') for split in SPLITS for side in ('src', 'tgt')]
  existing = [path for path in paths if os.path.exists(path)]
  if existing and not overwrite:
    raise errors.ConfigError(f'{existing[0]} already exists: pass --overwrite to replace it, '
                             'or choose another --out.')
  made = pairs(train_pairs, test_pairs, seed)
  try:
    os.makedirs(out, exist_ok=True)
    for split in SPLITS:
      for side, index in (('src', 0), ('tgt', 1)):
        with open(os.path.join(out, f'{split}.{side}'), 'w', encoding='utf-8') as f:
          f.writelines(pair[index] + '\n' for pair in made[split])
  except OSError as error:
    raise files.cannot_write(out, error) from None
  return paths


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m vit_jax.data.make_corpus',
      description='Write OUT/{train,test}.{src,tgt}: sentences of a made-up language and their '
                  'translations into another (other words, word order and agreement).')
  parser.add_argument('--out', required=True, help='the folder to write')
  parser.add_argument('--train_pairs', type=int, default=29_000, help='training pairs')
  parser.add_argument('--test_pairs', type=int, default=1_000, help='test pairs')
  parser.add_argument('--seed', type=int, default=0, help='the lexicons and the sentences')
  parser.add_argument('--overwrite', action='store_true', help='replace existing files')
  args = parser.parse_args(argv)
  try:
    make(args.out, args.train_pairs, args.test_pairs, args.seed, args.overwrite)
  except errors.UserError as error:
    print(f'error: {error}', file=sys.stderr)
    return 1
  print(f'Wrote {args.train_pairs} train and {args.test_pairs} test sentence pairs to '
        f'{args.out}/{{train,test}}.{{src,tgt}}')
  return 0


if __name__ == '__main__':
  entry.run(main)
