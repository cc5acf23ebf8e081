"""Joining requests into a batch and splitting its outputs: literal cases."""

from __future__ import annotations

import numpy as np

from asyncrt.serving._arrays import join, split


def test_join_lays_rows_end_to_end_and_repeats_the_last() -> None:
    a = np.array([[1, 2]])
    b = np.array([[3, 4], [5, 6]])
    out = join([a, b], 0, 4)
    np.testing.assert_array_equal(out, [[1, 2], [3, 4], [5, 6], [5, 6]])
    assert out.flags.c_contiguous


def test_join_along_another_axis() -> None:
    a = np.array([[1], [2]])
    b = np.array([[3], [4]])
    out = join([a, b], 1, 3)
    np.testing.assert_array_equal(out, [[1, 3, 3], [2, 4, 4]])


def test_join_pads_lengths_with_the_value() -> None:
    short = np.array([[1, 2]])
    long = np.array([[3, 4, 5]])
    out = join([short, long], 0, 2, length_axis=1, length=4, pad_value=-1)
    np.testing.assert_array_equal(out, [[1, 2, -1, -1], [3, 4, 5, -1]])


def test_join_pads_lengths_and_rows() -> None:
    out = join([np.array([[7]])], 0, 2, length_axis=1, length=2, pad_value=0)
    np.testing.assert_array_equal(out, [[7, 0], [7, 0]])


def test_split_cuts_rows_and_trims_lengths() -> None:
    output = np.arange(4 * 3).reshape(4, 3)
    pieces = split(output, 0, [1, 2])
    np.testing.assert_array_equal(pieces[0], [[0, 1, 2]])
    np.testing.assert_array_equal(pieces[1], [[3, 4, 5], [6, 7, 8]])
    trimmed = split(output, 0, [1, 2], length_axis=1, lengths=[2, 1])
    np.testing.assert_array_equal(trimmed[0], [[0, 1]])
    np.testing.assert_array_equal(trimmed[1], [[3], [6]])


def test_split_pieces_own_their_memory() -> None:
    output = np.zeros((2, 2))
    first, second = split(output, 1, [1, 1])
    first[...] = 5
    assert not output.any() and not second.any()
    assert first.flags.c_contiguous and first.flags.owndata
