"""An app's own data as device sources: each gives back exactly the samples and labels it was
handed (arrays untouched, batches spooled to disk, images decoded, tables split at the label
column), declares its input shape and label count, and says clearly what is wrong with bad input."""

from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data.sources import (ArraySource, BatchSource, DataSource, DataSourceError, ImageFolderSource,
                                   TabularSource, as_source, source_arrays)

RNG = np.random.default_rng(0)
X = RNG.random((37, 64), dtype=np.float32)
Y = RNG.integers(0, 10, 37).astype(np.int64)


def _batches():
    for i in range(0, len(X), 8):
        yield X[i:i + 8], Y[i:i + 8]


def test_arrays_are_used_as_they_are() -> None:
    source = ArraySource(X, Y)
    x, y = source_arrays(source)
    assert x is X and y is Y
    assert isinstance(source, DataSource)
    assert source.input_shape == (64,) and len(source) == 37 and source.num_classes == int(Y.max()) + 1
    assert sum(len(b[0]) for b in source.batches(10)) == 37


@pytest.mark.parametrize("spool", [False, True])
def test_batches_from_a_generator_function(tmp_path, spool: bool) -> None:
    source = BatchSource(_batches, spool_dir=tmp_path if spool else None)
    x, y = source_arrays(source)
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(y, Y)
    assert isinstance(x, np.memmap) == spool  # spooled: mapped from disk, not held in memory
    assert source.input_shape == (64,) and len(source) == 37


def test_a_device_takes_any_source_and_arrays_still() -> None:
    config = DeviceSettings(server="ws://127.0.0.1:1", device_id="d", budget_bytes=1 << 30)
    for data, labels in ((X, Y), (ArraySource(X, Y), None), (_batches, None), (list(_batches()), None)):
        client = DeviceClient(config, data, labels)
        np.testing.assert_array_equal(client.x, X)
        np.testing.assert_array_equal(client.y, Y)
        assert client.input_shape == (64,) and client.num_classes == int(Y.max()) + 1


def test_an_image_folder_gives_labels_from_its_subfolders(tmp_path) -> None:
    from PIL import Image

    pixels = (X[:12].reshape(12, 8, 8) * 255).round().astype(np.uint8)
    names = ["cat", "dog", "eel"]
    for i, p in enumerate(pixels):
        (tmp_path / names[i % 3]).mkdir(exist_ok=True)
        Image.fromarray(p, mode="L").save(tmp_path / names[i % 3] / f"{i:03d}.png")
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    flat = ImageFolderSource(tmp_path, mode="L", flatten=True)
    assert flat.classes == names and flat.num_classes == 3 and flat.input_shape == (64,) and len(flat) == 12
    x, y = source_arrays(flat)
    order = [i for c in range(3) for i in range(12) if i % 3 == c]
    np.testing.assert_allclose(x, pixels[order].reshape(12, 64) / 255, atol=1e-6)
    np.testing.assert_array_equal(y, [i % 3 for i in order])
    rgb = ImageFolderSource(tmp_path, size=(4, 4))
    assert rgb.input_shape == (3, 4, 4) and source_arrays(rgb)[0].shape == (12, 3, 4, 4)
    batches = list(rgb.batches(5))
    assert [len(b[0]) for b in batches] == [5, 5, 2] and batches[0][0].shape[1:] == (3, 4, 4)


def test_tables_split_at_the_label_column(tmp_path) -> None:
    header = ",".join([f"p{i}" for i in range(64)] + ["digit"])
    rows = "\n".join(",".join(f"{v:.9g}" for v in (*X[i], Y[i])) for i in range(len(X)))
    (tmp_path / "named.csv").write_text(header + "\n" + rows + "\n")
    (tmp_path / "plain.csv").write_text(rows + "\n")
    np.savez(tmp_path / "data.npz", x=X, y=Y)
    np.save(tmp_path / "first.npy", np.column_stack([Y, X]).astype(np.float32))
    for source in (TabularSource(tmp_path / "named.csv", label_column="digit"),
                   TabularSource(tmp_path / "plain.csv"), TabularSource(tmp_path / "data.npz"),
                   TabularSource(tmp_path / "first.npy", label_column=0)):
        x, y = source_arrays(source)
        np.testing.assert_allclose(x, X, rtol=1e-6)
        np.testing.assert_array_equal(y, Y)
        assert y.dtype == np.int64 and source.input_shape == (64,)
    shaped = TabularSource(tmp_path / "data.npz", input_shape=(1, 8, 8))
    assert shaped.input_shape == (1, 8, 8)
    np.save(tmp_path / "reg.npy", np.column_stack([X[:, :3], X[:, 3]]))
    assert TabularSource(tmp_path / "reg.npy").num_classes is None  # a fractional target: regression


def test_bad_data_is_named(tmp_path) -> None:
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataSourceError, match="no column named 'label'.*a, b"):
        TabularSource(tmp_path / "t.csv", label_column="label")
    with pytest.raises(DataSourceError, match="no data file"):
        TabularSource(tmp_path / "missing.csv")
    np.savez(tmp_path / "d.npz", inputs=X)
    with pytest.raises(DataSourceError, match="no array 'x'.*inputs"):
        TabularSource(tmp_path / "d.npz")
    with pytest.raises(DataSourceError, match="holds no images"):
        ImageFolderSource(tmp_path)
    with pytest.raises(DataSourceError, match="shape"):
        source_arrays(BatchSource([(X[:4], Y[:4]), (X[:4, :8], Y[:4])]))
    with pytest.raises(DataSourceError, match="no samples"):
        source_arrays(BatchSource([]))
    with pytest.raises(DataSourceError, match="cannot train on"):
        as_source(42)
