"""A table a job makes, with the order its rows are listed in.

A job returns its table unsorted, its order beside it (:class:`Ordered`). The report's
:func:`brokerd.analytics.report.collect` sorts it as it takes the first rows and counts
every row in the same pass (an observation under the sort): the count of a table
already sorted ran the table's whole plan a second time, from the events up.

May import: pyspark.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame


@dataclass(frozen=True)
class Ordered:
    """A table (``df``, unsorted) and the columns that order its rows (``order``)."""

    df: DataFrame
    order: tuple[Column | str, ...]

    def sorted(self) -> DataFrame:
        """The table in its order."""
        return self.df.orderBy(*self.order)
