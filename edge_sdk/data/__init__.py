"""Datasets as numpy arrays and their partitioning across simulated clients (numpy only)."""

from edge_sdk.data.datasets import (
    DATASET_NAMES,
    Dataset,
    DatasetUnavailable,
    data_root,
    load_dataset,
)
from edge_sdk.data.partition import SCHEMES, parse_partition, partition

__all__ = [
    "DATASET_NAMES",
    "SCHEMES",
    "Dataset",
    "DatasetUnavailable",
    "data_root",
    "load_dataset",
    "parse_partition",
    "partition",
]
