"""Datasets as numpy arrays and their partitioning across simulated clients (numpy only).

The research datasets are one table (:data:`DATASETS`, :mod:`edge_sdk.data.registry`); the loader
modules imported here register their entries, so the table is complete once this package is.
"""

from edge_sdk.data import datasets, shakespeare, tcga_brca  # noqa: F401  (each registers its datasets)
from edge_sdk.data.partition import SCHEMES, parse_partition, partition
from edge_sdk.data.registry import (
    DATA_ENV,
    DATASETS,
    Dataset,
    DatasetSpec,
    DatasetUnavailable,
    data_root,
    dataset_spec,
    load_dataset,
    locate_dataset,
    register_dataset,
)

#: The registered datasets' names, in table order.
DATASET_NAMES: tuple[str, ...] = tuple(DATASETS)

__all__ = [
    "DATASETS",
    "DATASET_NAMES",
    "DATA_ENV",
    "SCHEMES",
    "Dataset",
    "DatasetSpec",
    "DatasetUnavailable",
    "data_root",
    "dataset_spec",
    "load_dataset",
    "locate_dataset",
    "parse_partition",
    "partition",
    "register_dataset",
]
