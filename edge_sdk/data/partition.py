"""Split a dataset across simulated clients: IID, Dirichlet label skew, or natural groups.

Every scheme returns one sorted index array per client and is deterministic given ``seed``.
numpy only: this runs on devices and in fleet emulation.
"""

from __future__ import annotations

import numpy as np

SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "natural")
_DIRICHLET_DRAWS = 50  # fresh draws before repairing clients below min_size


def partition(
    labels_or_groups: np.ndarray,
    num_clients: int,
    scheme: str,
    *,
    alpha: float = 0.5,
    seed: int = 0,
    min_size: int = 1,
    groups_per_client: int | None = None,
) -> list[np.ndarray]:
    """Index arrays, one per client.

    - ``iid``: a shuffled split into sizes that differ by at most one.
    - ``dirichlet``: label skew; each class is spread over the clients in proportions drawn from
      Dirichlet(alpha) (the EmbracingFL paper's non-IID CIFAR-10/IMDB setting uses alpha = 0.1,
      Section 4 "Non-IID Data Settings"). Clients left with fewer than ``min_size`` samples after
      several draws receive samples moved from the largest clients.
    - ``natural``: ``labels_or_groups`` holds each sample's natural owner (a FEMNIST writer, a
      MovieLens user); every client receives whole groups. By default all groups are spread as
      evenly as possible; with ``groups_per_client`` each client gets exactly that many random
      groups and the rest are left out (the paper's FEMNIST setting: two random writers per client).
    """
    values = np.asarray(labels_or_groups)
    if values.ndim != 1:
        raise ValueError(f"labels_or_groups must be one-dimensional, got shape {values.shape}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}")
    if min_size < 0:
        raise ValueError(f"min_size must be non-negative, got {min_size}")
    n = len(values)
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        _check_enough(n, num_clients, min_size)
        owner = np.empty(n, dtype=np.int64)
        for client, part in enumerate(np.array_split(rng.permutation(n), num_clients)):
            owner[part] = client
        return _split_by_owner(owner, num_clients)
    if scheme == "dirichlet":
        if not alpha > 0:
            raise ValueError(f"dirichlet alpha must be positive, got {alpha}")
        _check_enough(n, num_clients, min_size)
        return _dirichlet(values, num_clients, alpha, min_size, rng)
    if scheme == "natural":
        return _natural(values, num_clients, groups_per_client, rng)
    raise ValueError(f"unknown partition scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")


def parse_partition(text: str, *, default_alpha: float = 0.5) -> tuple[str, float]:
    """``"iid"``, ``"natural"``, ``"dirichlet"`` or ``"dirichlet:0.3"`` -> (scheme, alpha)."""
    scheme, sep, arg = text.strip().partition(":")
    scheme = scheme.strip().lower()
    if scheme not in SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r} in {text!r}; choose one of {', '.join(SCHEMES)}")
    if not sep:
        return scheme, default_alpha
    if scheme != "dirichlet":
        raise ValueError(f"partition {scheme!r} takes no parameter, got {text!r}")
    try:
        alpha = float(arg)
    except ValueError:
        raise ValueError(f"dirichlet alpha must be a number, got {arg!r} in {text!r}") from None
    if not (alpha > 0 and np.isfinite(alpha)):
        raise ValueError(f"dirichlet alpha must be positive and finite, got {alpha} in {text!r}")
    return scheme, alpha


def _check_enough(n: int, num_clients: int, min_size: int) -> None:
    need = num_clients * max(min_size, 1)
    if n < need:
        raise ValueError(
            f"{n} samples cannot give {num_clients} clients at least {max(min_size, 1)} each (need {need})"
        )


def _dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    _, codes = np.unique(labels, return_inverse=True)
    by_class = [np.flatnonzero(codes == c) for c in range(codes.max() + 1)] if len(codes) else []
    for _ in range(_DIRICHLET_DRAWS):
        owner = np.empty(len(labels), dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(np.int64)
            for client, part in enumerate(np.split(idx, cuts)):
                owner[part] = client
        sizes = np.bincount(owner, minlength=num_clients)
        if sizes.min() >= min_size:
            break
    else:
        _repair(owner, num_clients, min_size, rng)
    return _split_by_owner(owner, num_clients)


def _split_by_owner(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Sorted sample indices of each client; samples owned by -1 belong to nobody."""
    order = np.argsort(owner, kind="stable")  # stable: indices stay sorted within a client
    order = order[owner[order] >= 0]
    bounds = np.cumsum(np.bincount(owner[order], minlength=num_clients))[:-1]
    return np.split(order, bounds)


def _repair(owner: np.ndarray, num_clients: int, min_size: int, rng: np.random.Generator) -> None:
    """Move random samples from the largest clients to those below ``min_size`` (in place)."""
    sizes = np.bincount(owner, minlength=num_clients)
    for client in np.flatnonzero(sizes < min_size):
        while sizes[client] < min_size:
            donor = int(np.argmax(sizes))
            sample = rng.choice(np.flatnonzero(owner == donor))
            owner[sample] = client
            sizes[donor] -= 1
            sizes[client] += 1


def _natural(
    groups: np.ndarray, num_clients: int, groups_per_client: int | None, rng: np.random.Generator
) -> list[np.ndarray]:
    unique, codes = np.unique(groups, return_inverse=True)
    num_groups = len(unique)
    if num_groups < num_clients:
        raise ValueError(
            f"natural partition needs at least one group per client: {num_groups} groups for {num_clients} clients"
        )
    shuffled = rng.permutation(num_groups)
    if groups_per_client is None:
        assignment = np.array_split(shuffled, num_clients)
    else:
        if groups_per_client < 1:
            raise ValueError(f"groups_per_client must be positive, got {groups_per_client}")
        if num_groups < num_clients * groups_per_client:
            raise ValueError(
                f"natural partition with {groups_per_client} groups per client needs "
                f"{num_clients * groups_per_client} groups, there are {num_groups}"
            )
        assignment = list(shuffled[: num_clients * groups_per_client].reshape(num_clients, groups_per_client))
    client_of_group = np.full(num_groups, -1, dtype=np.int64)
    for client, members in enumerate(assignment):
        client_of_group[members] = client
    return _split_by_owner(client_of_group[codes], num_clients)
