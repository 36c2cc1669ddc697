"""Each process's share of a split."""

import pytest

from vit_jax.data import hosts


def test_host_range_matches_tfds_even_splits():
  assert [hosts.host_range(11, i, 3) for i in range(3)] == [(0, 4), (4, 8), (8, 11)]
  assert [hosts.host_range(2, i, 3) for i in range(3)] == [(0, 1), (1, 2), (2, 2)]


def test_a_process_index_out_of_range_is_an_error():
  assert hosts.resolve_host(1, 2) == (1, 2)
  with pytest.raises(ValueError, match=r'process_index=2 must be in \[0, process_count=2\)'):
    hosts.resolve_host(2, 2)
