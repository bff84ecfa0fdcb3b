"""Fed-TCGA-BRCA (FLamby): 1,088 breast-cancer patients' clinical features and survival, in six
regions (natural silos: the region of the tissue source site that sent the patient's sample).

Each patient's region is that of the TSS code in their barcode (``TCGA-<TSS>-...``, ``centers.csv``);
the train/test split is FLamby's fixed, region-stratified one (``train_test_split.csv``). Features:
the 39 columns of ``brca.csv`` (one-hot clinical variables and the age at diagnosis, which is scaled
to years / 100 so that every feature is of order 1); targets: (E, T), the event indicator and the
time in days (the Cox model's, ``edge_sdk.models.survival``). As the ``fed_tcga_brca`` dataset
(``load_dataset("fed_tcga_brca")``) a patient's group is the index of their region in :data:`REGIONS`.

numpy only.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_sdk.data.registry import Dataset, locate_dataset, register_dataset, require

__all__ = ["REGIONS", "Patients", "concordance_index", "load_tcga_brca"]

#: FLamby's centers 0-5, in its order (train/test patients: 248/63, 156/40, 164/42, 129/33, 129/33, 40/11).
REGIONS: tuple[str, ...] = ("Northeast", "South", "West", "Midwest", "Europe", "Canada")


@dataclass(frozen=True)
class Patients:
    """Features ``x`` (n, 39) float32, targets ``y`` (n, 2) float32 = (E, T), and each one's ``region``."""

    x: np.ndarray
    y: np.ndarray
    region: np.ndarray

    def of(self, region: str) -> "Patients":
        keep = self.region == region
        return Patients(self.x[keep], self.y[keep], self.region[keep])


def load_tcga_brca(split: str = "train", root: Path | str | None = None) -> Patients:
    """The ``split`` ("train" or "test") patients of every region, from the data root ``root``
    (default ``$EDGETRAIN_DATA``)."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; choose train or test")
    folder = locate_dataset("fed_tcga_brca", root)
    assert folder is not None
    return _read_patients(folder, split)


@register_dataset("fed_tcga_brca", path="fed_tcga_brca", groups="region (cross-silo)",
                  description="Fed-TCGA-BRCA (FLamby): 39 clinical features -> survival (E, T), one client per region")
def _fed_tcga_brca(folder: Path, split: str) -> Dataset:
    """The patients as a dataset: ``y`` is (E, T) (``num_classes`` 0), ``groups`` the region's index."""
    p = _read_patients(folder, split)
    unknown = sorted(set(p.region) - set(REGIONS))
    if unknown:
        raise ValueError(f"{folder / 'centers.csv'}: patients of unknown regions {unknown}; known: {REGIONS}")
    groups = np.array([REGIONS.index(r) for r in p.region], np.int64)
    return Dataset(p.x, p.y, 0, "fed_tcga_brca", groups=groups, info={"regions": REGIONS})


def _read_patients(folder: Path, split: str) -> Patients:
    with open(require(folder / "centers.csv", "fed_tcga_brca"), newline="") as f:
        region_of = {row["TSS Code"]: row["Region"] for row in csv.DictReader(f)}
    with open(require(folder / "train_test_split.csv", "fed_tcga_brca"), newline="") as f:
        fold = {row["pid"]: row["fold"] for row in csv.DictReader(f)}
    with open(require(folder / "brca.csv", "fed_tcga_brca"), newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = [r for r in reader if fold.get(r[0]) == split]
    features = header[1:-2]
    if header[-2:] != ["E", "T"] or len(features) != 39:
        raise ValueError(f"{folder / 'brca.csv'}: expected pid, 39 features, E, T; got {len(header)} columns")
    x = np.array([[float(v) for v in r[1:-2]] for r in rows], np.float32)
    x[:, features.index("age_at_index")] /= 100.0
    y = np.array([[float(r[-2]), float(r[-1])] for r in rows], np.float32)
    region = np.array([region_of.get(r[0].split("-")[1], "") for r in rows])
    return Patients(x, y, region)


def concordance_index(risk: np.ndarray, y: np.ndarray) -> float:
    """Harrell's C-index (FLamby's metric): of the pairs where the patient with the shorter time had
    an event, the share in which that patient has the higher risk (ties count one half)."""
    risk = np.asarray(risk, np.float64).reshape(-1)
    event, time = y[:, 0] > 0, y[:, 1]
    first = event[:, None] & (time[:, None] < time[None, :])  # pair (i, j): i died before j's time
    pairs = int(first.sum())
    if pairs == 0:
        return float("nan")
    wins = (risk[:, None] > risk[None, :]) & first
    ties = (risk[:, None] == risk[None, :]) & first
    return float((wins.sum() + 0.5 * ties.sum()) / pairs)
