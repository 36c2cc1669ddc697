"""Tests for the generated dates corpus (vit_jax.data.dates): pinned, disjoint splits whose
sources name their ISO target in several languages and formats."""

import datetime
import re

import pytest

from vit_jax.data import dates

# Weekday names per language, Monday first, written out here independently of `dates`.
WEEKDAYS = {
    'en': 'monday tuesday wednesday thursday friday saturday sunday',
    'en_short': 'mon tue wed thu fri sat sun',
    'de': 'montag dienstag mittwoch donnerstag freitag samstag sonntag',
    'de_short': 'mo. di. mi. do. fr. sa. so.',
    'fr': 'lundi mardi mercredi jeudi vendredi samedi dimanche',
    'es': 'lunes martes miércoles jueves viernes sábado domingo',
    'it': 'lunedì martedì mercoledì giovedì venerdì sabato domenica',
}
WEEKDAY_NUMBERS = {name: number for names in WEEKDAYS.values()
                   for number, name in enumerate(names.split())}


@pytest.fixture(scope='module')
def dates_splits():
  return dates.generate(train_size=dates.NUM_DAYS, test_size=1000, seed=0)


def test_dates_are_deterministic_and_pinned(dates_splits):
  again = dates.generate(train_size=300, test_size=1000, seed=0)
  assert again['train'] == dates_splits['train'][:300]
  assert again['test'] == dates_splits['test']
  # Pinned, so that reported test accuracies are comparable between machines and versions.
  assert dates_splits['test'][:3] == [('2 agosto 2037', '2037-08-02'),
                                      ('le 5 octobre 2033', '2033-10-05'),
                                      ('Fri, May 13, 1960', '1960-05-13')]
  assert dates.generate(300, 1000, seed=1)['test'] != dates_splits['test']


def test_dates_train_and_test_share_no_date(dates_splits):
  train_dates = {target for _, target in dates_splits['train']}
  test_dates = [target for _, target in dates_splits['test']]
  assert len(set(test_dates)) == 1000  # Distinct test dates.
  assert not train_dates & set(test_dates)
  assert len(train_dates) == dates.NUM_DAYS - 1000  # Train uses every other date once.
  train_sources = {source for source, _ in dates_splits['train']}
  assert not train_sources & {source for source, _ in dates_splits['test']}


def test_dates_targets_are_iso_and_sources_name_their_date(dates_splits):
  examples = dates_splits['train'][:5000]
  seen_weekdays = 0
  for source, target in examples:
    date = datetime.date.fromisoformat(target)
    assert 1900 <= date.year <= 2099
    words = source.lower().replace(',', ' ').split()
    named = [WEEKDAY_NUMBERS[w] for w in words if w in WEEKDAY_NUMBERS]
    if named:
      seen_weekdays += 1
      assert named == [date.weekday()], (source, target)
    if str(date.year) not in source:  # Two-digit years: 69-99 -> 19xx, 00-68 -> 20xx.
      assert 1969 <= date.year <= 2068, (source, target)
      assert re.fullmatch(r'\d+[./]\d+[./]\d\d', source), (source, target)
      assert source.endswith(f'{date.year % 100:02d}')
  assert seen_weekdays > 1000


def test_dates_parse_back_in_c_locale(dates_splits):
  # English formats with full names, parsed by the standard library.
  patterns = {r'\w+day, \d+ \w+ \d{4}': '%A, %d %B %Y', r'\w+ \d+, \d{4}': '%B %d, %Y',
              r'\d\d/\d\d/\d\d': '%m/%d/%y', r'\d\d\.\d\d\.\d{4}': '%d.%m.%Y',
              r'\d{8}': '%Y%m%d'}
  parsed = 0
  for source, target in dates_splits['train'][:3000]:
    for pattern, date_format in patterns.items():
      if re.fullmatch(pattern, source):
        try:
          date = datetime.datetime.strptime(source, date_format).date()
        except ValueError:
          continue  # E.g. 'May 3, 1979' matches r'\w+ \d+' but abbreviations differ.
        assert date.isoformat() == target, source
        parsed += 1
  assert parsed > 300


def test_dates_cover_languages_and_formats(dates_splits):
  sources = ' '.join(source.lower() for source, _ in dates_splits['train'][:5000])
  for words in (('march', 'saturday'), ('märz', 'samstag', 'am'), ('mars', 'samedi', '1er'),
                ('marzo', 'sábado', ' de '), ('settembre', 'sabato'), ('/', '.')):
    assert all(w in sources for w in words), words
  # Several casings of the same words.
  cased = ' '.join(s for s, _ in dates_splits['train'][:5000])
  assert all(word in cased for word in ('March', 'march', 'MARCH', 'Mars', 'MÄRZ'))
  assert len({name for name in dates.FORMATS}) >= 25


def test_dates_test_split_does_not_depend_on_train_size():
  assert (dates.generate(10, 50, seed=3)['test'] == dates.generate(900, 50, seed=3)['test'])
