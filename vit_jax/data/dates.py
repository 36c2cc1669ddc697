"""The embedded 'dates' translation task: human-written dates -> ISO 8601 'YYYY-MM-DD'.

Sources are dates between 1900-01-01 and 2099-12-31 written in one of `FORMATS` (English,
German, French, Spanish, Italian and numeric styles), sometimes lower-, upper- or title-cased;
weekday names are those of the date. Targets are the ISO dates. Numeric styles use one fixed
convention each, so every source names exactly one date:

  slashes: US order, month/day/year ('3/3/1979', '03/03/79');
  dots: German order, day.month.year ('03.03.1979', '3.3.79');
  year first: year, month, day ('1979-03-03', '1979/03/03', '19790303').

Two-digit years follow POSIX strptime's %y: 69-99 are 1969-1999 and 00-68 are 2000-2068, so
those formats are only used for dates in 1969-2068. The test split's dates are never train dates
(and so no source string is in both splits); both splits are fixed by the seed alone, and the
test split does not depend on the train size.
"""

import datetime
from typing import Callable

import numpy as np

from vit_jax import errors

FIRST_DATE = datetime.date(1900, 1, 1)
LAST_DATE = datetime.date(2099, 12, 31)
NUM_DAYS = LAST_DATE.toordinal() - FIRST_DATE.toordinal() + 1  # 73049.
TWO_DIGIT_YEARS = (1969, 2068)  # Inclusive range that two-digit years stand for (POSIX %y).

_EN_MONTHS = ('January', 'February', 'March', 'April', 'May', 'June', 'July', 'August',
              'September', 'October', 'November', 'December')
_EN_WEEKDAYS = ('Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday')
_DE_MONTHS = ('Januar', 'Februar', 'März', 'April', 'Mai', 'Juni', 'Juli', 'August',
              'September', 'Oktober', 'November', 'Dezember')
_DE_MONTHS_SHORT = ('Jan.', 'Feb.', 'März', 'Apr.', 'Mai', 'Juni', 'Juli', 'Aug.', 'Sep.',
                    'Okt.', 'Nov.', 'Dez.')
_DE_WEEKDAYS = ('Montag', 'Dienstag', 'Mittwoch', 'Donnerstag', 'Freitag', 'Samstag', 'Sonntag')
_DE_WEEKDAYS_SHORT = ('Mo.', 'Di.', 'Mi.', 'Do.', 'Fr.', 'Sa.', 'So.')
_FR_MONTHS = ('janvier', 'février', 'mars', 'avril', 'mai', 'juin', 'juillet', 'août',
              'septembre', 'octobre', 'novembre', 'décembre')
_FR_MONTHS_SHORT = ('janv.', 'févr.', 'mars', 'avr.', 'mai', 'juin', 'juil.', 'août', 'sept.',
                    'oct.', 'nov.', 'déc.')
_FR_WEEKDAYS = ('lundi', 'mardi', 'mercredi', 'jeudi', 'vendredi', 'samedi', 'dimanche')
_ES_MONTHS = ('enero', 'febrero', 'marzo', 'abril', 'mayo', 'junio', 'julio', 'agosto',
              'septiembre', 'octubre', 'noviembre', 'diciembre')
_ES_WEEKDAYS = ('lunes', 'martes', 'miércoles', 'jueves', 'viernes', 'sábado', 'domingo')
_IT_MONTHS = ('gennaio', 'febbraio', 'marzo', 'aprile', 'maggio', 'giugno', 'luglio', 'agosto',
              'settembre', 'ottobre', 'novembre', 'dicembre')
_IT_WEEKDAYS = ('lunedì', 'martedì', 'mercoledì', 'giovedì', 'venerdì', 'sabato', 'domenica')

# Probabilities of the casings of word formats: as written, lower, UPPER, Title Case.
_CASINGS = ('as_written', 'lower', 'upper', 'title')
_CASING_PROBABILITIES = (0.7, 0.1, 0.1, 0.1)


def _en_ordinal(day: int) -> str:
  suffix = 'th' if 11 <= day <= 13 else {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th')
  return f'{day}{suffix}'


def _fr_day(day: int) -> str:
  return '1er' if day == 1 else str(day)  # French writes the first of the month as '1er'.


def _it_day(day: int) -> str:
  return '1º' if day == 1 else str(day)  # Italian: '1º marzo'.


# name -> (function date -> source text, True when the format has a two-digit year).
FORMATS: dict[str, tuple[Callable[[datetime.date], str], bool]] = {
    # English.
    'en_weekday_day_month_year': (
        lambda d: f'{_EN_WEEKDAYS[d.weekday()]}, {d.day} {_EN_MONTHS[d.month - 1]} {d.year}',
        False),
    'en_day_month_year': (lambda d: f'{d.day} {_EN_MONTHS[d.month - 1]} {d.year}', False),
    'en_day_mon_year': (lambda d: f'{d.day} {_EN_MONTHS[d.month - 1][:3]} {d.year}', False),
    'en_month_day_year': (lambda d: f'{_EN_MONTHS[d.month - 1]} {d.day}, {d.year}', False),
    'en_mon_day_year': (lambda d: f'{_EN_MONTHS[d.month - 1][:3]} {d.day}, {d.year}', False),
    'en_weekday_month_day_year': (
        lambda d: f'{_EN_WEEKDAYS[d.weekday()]}, {_EN_MONTHS[d.month - 1]} {d.day}, {d.year}',
        False),
    'en_wkd_mon_day_year': (
        lambda d: f'{_EN_WEEKDAYS[d.weekday()][:3]}, {_EN_MONTHS[d.month - 1][:3]} {d.day}, '
                  f'{d.year}', False),
    'en_ordinal_month_year': (
        lambda d: f'{_en_ordinal(d.day)} {_EN_MONTHS[d.month - 1]} {d.year}', False),
    'en_month_ordinal_year': (
        lambda d: f'{_EN_MONTHS[d.month - 1]} {_en_ordinal(d.day)}, {d.year}', False),
    'en_the_ordinal_of_month_year': (
        lambda d: f'the {_en_ordinal(d.day)} of {_EN_MONTHS[d.month - 1]} {d.year}', False),
    'us_slashes': (lambda d: f'{d.month}/{d.day}/{d.year}', False),
    'us_slashes_two_digit_year': (lambda d: f'{d.month:02d}/{d.day:02d}/{d.year % 100:02d}', True),
    # German.
    'de_day_month_year': (lambda d: f'{d.day}. {_DE_MONTHS[d.month - 1]} {d.year}', False),
    'de_weekday_day_month_year': (
        lambda d: f'{_DE_WEEKDAYS[d.weekday()]}, {d.day}. {_DE_MONTHS[d.month - 1]} {d.year}',
        False),
    'de_wkd_day_mon_year': (
        lambda d: f'{_DE_WEEKDAYS_SHORT[d.weekday()]}, {d.day}. {_DE_MONTHS_SHORT[d.month - 1]} '
                  f'{d.year}', False),
    'de_am_day_month_year': (lambda d: f'am {d.day}. {_DE_MONTHS[d.month - 1]} {d.year}', False),
    'de_dots': (lambda d: f'{d.day:02d}.{d.month:02d}.{d.year}', False),
    'de_dots_two_digit_year': (lambda d: f'{d.day}.{d.month}.{d.year % 100:02d}', True),
    # French.
    'fr_le_day_month_year': (
        lambda d: f'le {_fr_day(d.day)} {_FR_MONTHS[d.month - 1]} {d.year}', False),
    'fr_weekday_day_month_year': (
        lambda d: f'{_FR_WEEKDAYS[d.weekday()]} {_fr_day(d.day)} {_FR_MONTHS[d.month - 1]} '
                  f'{d.year}', False),
    'fr_le_weekday_day_month_year': (
        lambda d: f'le {_FR_WEEKDAYS[d.weekday()]} {_fr_day(d.day)} {_FR_MONTHS[d.month - 1]} '
                  f'{d.year}', False),
    'fr_day_mon_year': (
        lambda d: f'{_fr_day(d.day)} {_FR_MONTHS_SHORT[d.month - 1]} {d.year}', False),
    # Spanish.
    'es_day_de_month_de_year': (
        lambda d: f'{d.day} de {_ES_MONTHS[d.month - 1]} de {d.year}', False),
    'es_weekday_day_de_month_de_year': (
        lambda d: f'{_ES_WEEKDAYS[d.weekday()]}, {d.day} de {_ES_MONTHS[d.month - 1]} de '
                  f'{d.year}', False),
    'es_el_day_de_month_de_year': (
        lambda d: f'el {d.day} de {_ES_MONTHS[d.month - 1]} de {d.year}', False),
    # Italian.
    'it_day_month_year': (
        lambda d: f'{_it_day(d.day)} {_IT_MONTHS[d.month - 1]} {d.year}', False),
    'it_weekday_day_month_year': (
        lambda d: f'{_IT_WEEKDAYS[d.weekday()]} {_it_day(d.day)} {_IT_MONTHS[d.month - 1]} '
                  f'{d.year}', False),
    # Year first.
    'iso': (lambda d: d.isoformat(), False),
    'year_slashes': (lambda d: f'{d.year}/{d.month:02d}/{d.day:02d}', False),
    'year_compact': (lambda d: f'{d.year}{d.month:02d}{d.day:02d}', False),
}
_NUMERIC_FORMATS = ('us_slashes', 'us_slashes_two_digit_year', 'de_dots',
                    'de_dots_two_digit_year', 'iso', 'year_slashes', 'year_compact')


def _cased(text: str, casing: str) -> str:
  if casing == 'lower':
    return text.lower()
  if casing == 'upper':
    return text.upper()
  if casing == 'title':  # Not str.title(), which would write '3Rd'.
    return ' '.join(word[:1].upper() + word[1:] for word in text.split(' '))
  return text


def _render(days: np.ndarray, rng: np.random.Generator) -> list[tuple[str, str]]:
  """(source, 'YYYY-MM-DD') for each day index (0 = FIRST_DATE), formats drawn from rng."""
  names = list(FORMATS)
  four_digit_names = [name for name in names if not FORMATS[name][1]]
  # Two uniform draws per example pick its format and casing; example i gets the same draws
  # whatever the number of examples.
  draws = rng.random((len(days), 2))
  casings = np.searchsorted(np.cumsum(_CASING_PROBABILITIES), draws[:, 1], side='right')
  casings = np.minimum(casings, len(_CASINGS) - 1)
  pairs = []
  for day, draw, casing in zip(days.tolist(), draws[:, 0].tolist(), casings.tolist()):
    date = datetime.date.fromordinal(FIRST_DATE.toordinal() + day)
    usable = (names if TWO_DIGIT_YEARS[0] <= date.year <= TWO_DIGIT_YEARS[1]
              else four_digit_names)
    name = usable[int(draw * len(usable))]
    source = FORMATS[name][0](date)
    if name not in _NUMERIC_FORMATS:
      source = _cased(source, _CASINGS[casing])
    pairs.append((source, date.isoformat()))
  return pairs


def generate(train_size: int, test_size: int, seed: int = 0
             ) -> dict[str, list[tuple[str, str]]]:
  """The 'dates' splits: {'train' | 'test': [(source, target), ...]}, fixed by `seed`.

  Test examples have distinct dates; train examples use the other dates (each once while
  train_size <= NUM_DAYS - test_size, cycling after that).
  """
  if not 0 < test_size < NUM_DAYS:
    raise errors.ConfigError(f'dates_test_size={test_size} must be in [1, {NUM_DAYS - 1}] (one '
                             f'date per test example; there are {NUM_DAYS} dates in 1900-2099).')
  if train_size < 1:
    raise errors.ConfigError(f'dates_train_size={train_size} must be >= 1.')
  split_seed, train_seed, test_seed = np.random.SeedSequence(seed).spawn(3)
  days = np.random.default_rng(split_seed).permutation(NUM_DAYS)
  test_days, train_days = days[:test_size], days[test_size:]
  train_days = train_days[np.arange(train_size) % len(train_days)]
  return {
      'train': _render(train_days, np.random.default_rng(train_seed)),
      'test': _render(test_days, np.random.default_rng(test_seed)),
  }
