"""Device bundles: written server-side, checked and read lazily device-side, and the ``bundle`` command."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edge_sdk.bundle import BUNDLE_FORMAT_VERSION, BundleError, load_bundle, manifest_digest
from edge_sdk.forward import multi_step_forward
from edge_sdk.models.zoo import build_model, digits_mlp
from exporters.bundle import check_chunks, write_bundle
from exporters.cache import ChunkCache, chunk_id
from exporters.onnx_export import ExportSettings, export_chunk

WIDTH = 128


@pytest.fixture(scope="module")
def model():
    with torch.random.fork_rng():
        torch.manual_seed(5)
        return digits_mlp(width=WIDTH).eval()  # the zoo's block structure, narrow enough to be quick


@pytest.fixture(scope="module")
def bundle_path(model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "digits.tar"
    write_bundle(model, 2, [(0, 1), (1, 2)], out, version=12, device_class="pi-zero", role="moderate")
    return out


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]


def _write(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _edit_manifest(members: dict[str, bytes], edit, *, redigest: bool) -> dict[str, bytes]:
    manifest = json.loads(members["manifest.json"])
    edit(manifest)
    if redigest:
        manifest["digest"] = manifest_digest(manifest)
    return {**members, "manifest.json": json.dumps(manifest).encode()}


def test_bundle_round_trips(model, bundle_path):
    bundle = load_bundle(bundle_path)
    m = bundle.manifest
    assert (m.model, m.model_version, m.split, m.num_blocks) == ("digits_mlp", "12", 2, 4)
    assert (m.role, m.device_class, m.format_version) == ("moderate", "pi-zero", BUNDLE_FORMAT_VERSION)
    assert m.block_names == ("fc1", "fc2", "fc3", "head")
    assert [(c.start, c.stop) for c in m.chunks] == [(0, 1), (1, 2)]
    assert [c.id for c in m.chunks] == [chunk_id("digits_mlp", 12, a, b, ExportSettings()) for a, b in [(0, 1), (1, 2)]]
    assert [(c.input_shape, c.output_shape) for c in m.chunks] == [((64,), (WIDTH,)), ((WIDTH,), (WIDTH,))]
    assert m.tail.input_shape == (WIDTH,) and (m.tail.start, m.tail.stop) == (2, 4)

    # the frozen chunks, chained from the bundle, compute the model's prefix
    x = np.random.default_rng(0).random((9, 64), dtype=np.float32)
    cache = multi_step_forward(bundle.iter_chunks(), x, batch_size=4)
    with torch.no_grad():
        expected = model(torch.from_numpy(x), 0, 2).numpy()
    np.testing.assert_allclose(cache.array, expected, atol=1e-5)

    # the tail holds exactly the state of blocks [2, 4)
    tail = bundle.tail()
    state = model.state_dict()
    assert sorted(tail) == sorted(model.state_names(2)) and all(n.startswith(("blocks.fc3.", "blocks.head.")) for n in tail)
    for name, array in tail.items():
        np.testing.assert_array_equal(array, state[name].numpy())

    with bundle.runner(1) as runner:
        assert runner.input_shape == (WIDTH,) and runner.output_shape == (WIDTH,)


def test_manifest_survives_a_json_round_trip(bundle_path):
    manifest = load_bundle(bundle_path).manifest
    assert json.loads(manifest.to_json()) == json.loads(_members(bundle_path)["manifest.json"])


def test_tampered_chunk_byte_is_caught(bundle_path, tmp_path):
    members = _members(bundle_path)
    name = "chunks/001-blocks-1-2.onnx"
    data = bytearray(members[name])
    data[len(data) // 2] ^= 0x01
    bad = _write(tmp_path / "bad.tar", {**members, name: bytes(data)})
    with pytest.raises(BundleError, match=r"sha256 of chunks/001-blocks-1-2\.onnx is [0-9a-f]{64}, the manifest says"):
        load_bundle(bad)


def test_tampered_manifest_field_is_caught(bundle_path, tmp_path):
    members = _members(bundle_path)

    def bump_version(m):
        m["model_version"] = "13"

    bad = _write(tmp_path / "bad.tar", _edit_manifest(members, bump_version, redigest=False))
    with pytest.raises(BundleError, match="manifest digest mismatch"):
        load_bundle(bad)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda m: m["chunks"][1].update(input_shape=[127]), r"chunk 1 takes float32\[127\] but receives float32\[128\]"),
        (lambda m: m.update(split=3), r"chunks cover blocks \[0, 2\) but the split is 3"),
        (lambda m: m["chunks"][1].update(start=0), r"chunk 1 covers blocks \[0, 2\)"),
        (lambda m: m["tail"].update(input_shape=[32]), "tail takes"),
        (lambda m: m["tail"]["tensors"][0].update(name="blocks.fc1.weight"), "not in the trainable blocks"),
        (lambda m: m.update(split="2"), "malformed manifest: field 'split' has the wrong type"),
        (lambda m: m.pop("chunks"), "malformed manifest: .*missing field 'chunks'"),
        (lambda m: m["chunks"][0].update(size=5), r"000-blocks-0-1\.onnx is \d+ bytes, the manifest says 5"),
    ],
)
def test_inconsistent_manifest_is_caught_even_with_a_valid_digest(bundle_path, tmp_path, edit, message):
    bad = _write(tmp_path / "bad.tar", _edit_manifest(_members(bundle_path), edit, redigest=True))
    with pytest.raises(BundleError, match=message):
        load_bundle(bad)


def test_unsupported_format_version_is_caught(bundle_path, tmp_path):
    bad = _write(
        tmp_path / "bad.tar",
        _edit_manifest(_members(bundle_path), lambda m: m.update(format_version=99), redigest=True),
    )
    with pytest.raises(BundleError, match="bundle format version 99 is not supported"):
        load_bundle(bad)


def test_missing_and_extra_files_are_caught(bundle_path, tmp_path):
    members = _members(bundle_path)
    without_tail = {k: v for k, v in members.items() if k != "tail.npz"}
    with pytest.raises(BundleError, match=r"missing: \['tail.npz'\]"):
        load_bundle(_write(tmp_path / "a.tar", without_tail))
    without_manifest = {k: v for k, v in members.items() if k != "manifest.json"}
    with pytest.raises(BundleError, match="manifest.json is missing"):
        load_bundle(_write(tmp_path / "b.tar", without_manifest))
    with pytest.raises(BundleError, match=r"not listed in the manifest: \['extra.bin'\]"):
        load_bundle(_write(tmp_path / "c.tar", {**members, "extra.bin": b"x"}))
    with pytest.raises(BundleError, match="no such bundle"):
        load_bundle(tmp_path / "nothing.tar")
    (tmp_path / "junk.tar").write_bytes(b"not a tar archive at all" * 40)
    with pytest.raises(BundleError, match="not a bundle archive"):
        load_bundle(tmp_path / "junk.tar")


def test_chunk_changed_after_loading_is_caught(bundle_path, tmp_path):
    copy = tmp_path / "copy.tar"
    copy.write_bytes(bundle_path.read_bytes())
    bundle = load_bundle(copy)
    member = bundle._members[bundle.manifest.chunks[0].file]
    with open(copy, "r+b") as f:
        f.seek(member.offset + 100)
        byte = f.read(1)
        f.seek(member.offset + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(BundleError, match="changed since the bundle was loaded"):
        bundle.chunk_bytes(0)
    assert bundle.chunk_bytes(1)  # the others still read


def test_bad_chunking_is_rejected(model, tmp_path):
    with pytest.raises(ValueError, match="cover blocks"):
        write_bundle(model, 3, [(0, 1), (2, 3)], tmp_path / "x.tar", version=1)
    with pytest.raises(ValueError, match="split is 3"):
        check_chunks([(0, 2)], 3, 4)
    with pytest.raises(ValueError, match="must train at least one block"):
        check_chunks([(0, 4)], 4, 4)
    assert not (tmp_path / "x.tar").exists()


def test_strong_bundle_has_no_chunks_and_the_cache_is_reused(model, tmp_path):
    cache = ChunkCache(2**24)
    m = write_bundle(model, 0, [], tmp_path / "strong.tar", version=1, cache=cache)
    assert m.chunks == () and len(load_bundle(tmp_path / "strong.tar").tail()) == len(model.state_dict())
    write_bundle(model, 2, [(0, 2)], tmp_path / "a.tar", version=1, cache=cache)
    write_bundle(model, 2, [(0, 2)], tmp_path / "b.tar", version=1, cache=cache)
    assert cache.stats.exports == 1 and cache.stats.hits == 1
    assert load_bundle(tmp_path / "a.tar").chunk_bytes(0) == load_bundle(tmp_path / "b.tar").chunk_bytes(0)


# -- the command line --------------------------------------------------------------------------
def _cli(*args: str):
    from edgetrain.cli import _register, app

    _register()
    return CliRunner().invoke(app, ["bundle", *args])


def test_cli_split_writes_a_loadable_bundle(tmp_path):
    out = tmp_path / "leaf.tar"
    result = _cli("--model", "leaf_cnn", "--split", "2", "--version", "7", "--out", str(out))
    assert result.exit_code == 0, result.output
    bundle = load_bundle(out)
    assert bundle.manifest.split == 2 and bundle.manifest.model_version == "7"
    assert [(c.start, c.stop) for c in bundle.manifest.chunks] == [(0, 1), (1, 2)]
    assert "chunk [1, 2)" in result.output


def test_cli_writes_the_bundle_for_the_servers_transfer_settings(tmp_path):
    """By default the server's defaults (chunks as int4 deltas, so held as a device rebuilds them);
    with every setting none, the chunks as exported."""
    lossy, exact = tmp_path / "default.tar", tmp_path / "exact.tar"
    assert _cli("--model", "digits_mlp", "--split", "1", "--out", str(lossy)).exit_code == 0
    result = _cli("--model", "digits_mlp", "--split", "1", "--out", str(exact), "--chunk-codec", "none",
                  "--graph-codec", "none", "--download-delta", "none")
    assert result.exit_code == 0, result.output
    d, e = load_bundle(lossy).manifest, load_bundle(exact).manifest
    assert d.transfer == {"chunk_codec": "shuffle", "graph_codec": "shuffle", "download_delta": "int4"}
    assert d.held_form("chunk") == "delta int4" and e.held_form("chunk") == "none"
    assert e.chunks[0].sha256 == e.chunks[0].served_sha256 == hashlib.sha256(
        export_chunk(build_model("digits_mlp", seed=0), 0, 1)).hexdigest()
    assert d.chunks[0].sha256 == d.chunks[0].served_sha256 != e.chunks[0].sha256
    bad = _cli("--model", "digits_mlp", "--split", "1", "--out", str(tmp_path / "x.tar"), "--download-delta", "int5")
    assert bad.exit_code == 2 and "--download-delta must be one of none, int8, int4, int2" in bad.output


@pytest.mark.parametrize("how", [["--budget", "125MiB"], ["--device", "pi-4-2gb"]])
def test_cli_plans_the_split_like_the_planner(tmp_path, how):
    from profiles.devices import load_device_class
    from profiles.planner import plan_split

    # --runtime fixes the runtimes' share, so the plan does not depend on measuring this machine
    budget = 125 * 2**20 if how[0] == "--budget" else load_device_class(how[1]).budget_bytes
    plan = plan_split(build_model("leaf_cnn"), budget, batch_size=16, runtime=0)
    out = tmp_path / "planned.tar"
    result = _cli("--model", "leaf_cnn", *how, "--batch", "16", "--runtime", "0", "--out", str(out))
    assert result.exit_code == 0, result.output
    m = load_bundle(out).manifest
    assert (m.split, m.role, [(c.start, c.stop) for c in m.chunks]) == (plan.split, plan.role, list(plan.chunks))
    assert m.device_class == (how[1] if how[0] == "--device" else None)


def test_cli_reports_a_budget_that_fits_nothing(tmp_path):
    result = _cli("--model", "leaf_cnn", "--budget", "1MiB", "--runtime", "0", "--out", str(tmp_path / "x.tar"))
    assert result.exit_code == 2 and "does not fit a budget of 1.0 MiB" in result.output
    assert not (tmp_path / "x.tar").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "tiny", "--out", "x.tar"], "exactly one of --device, --budget, --split"),
        (["--model", "tiny", "--split", "1", "--budget", "1MiB", "--out", "x.tar"], "exactly one"),
        (["--model", "tiny", "--split", "2", "--out", "x.tar"], r"--split must be in \[0, 2\)"),
        (["--model", "nope", "--split", "1", "--out", "x.tar"], "unknown model 'nope'"),
        (["--model", "tiny", "--device", "toaster", "--out", "x.tar"], "unknown device class 'toaster'"),
        (["--model", "tiny", "--budget", "lots", "--out", "x.tar"], "not a memory size: 'lots'"),
        (["--model", "tiny", "--split", "1", "--runtime", "1MiB", "--out", "x.tar"], "--runtime sets the plan"),
    ],
)
def test_cli_rejects_bad_arguments(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = _cli(*args)
    assert result.exit_code == 2
    assert re.search(message, result.output)
    assert not (tmp_path / "x.tar").exists()


def test_a_bundle_with_declared_rows_carries_only_those_rows(tmp_path):
    from edge_sdk.protocol import RowSparse
    from edge_sdk.trainer import build_tail, load_tail_state

    rec = build_model("recommender")
    state = {k: v.numpy() for k, v in rec.state_dict().items()}
    user, item = "blocks.embeddings.user.weight", "blocks.embeddings.item.weight"
    row_bytes = state[item].shape[1] * 4
    sizes = {}
    for n in (10, 100, 1000):
        rows = {user: [3], item: np.arange(0, 9 * n, 9)}
        m = write_bundle(rec, 0, [], tmp_path / f"rows-{n}.tar", version=1, rows=rows)
        sizes[n] = m.tail.size
        assert {(r.name, r.num_rows, r.count) for r in m.tail.rows} == {(user, 611, 1), (item, 9_742, n)}
        tail = load_bundle(tmp_path / f"rows-{n}.tar").tail()
        got = tail[item]
        assert isinstance(got, RowSparse) and got.num_rows == 9_742
        np.testing.assert_array_equal(got.indices, rows[item])
        np.testing.assert_array_equal(got.values, state[item][rows[item]])
        # The device builds its tables with just these rows and loads the bundle into them.
        tail_model = build_tail("recommender", 0, {user: 1, item: n})
        load_tail_state(tail_model, 0, tail)
        assert tail_model.state_dict()[item].shape == (n, 32)
    whole = write_bundle(rec, 0, [], tmp_path / "whole.tar", version=1).tail.size
    # Size grows with the rows (values and an int64 index per row), never with the 10,353-row tables.
    assert sizes[1000] - sizes[100] == pytest.approx(900 * (row_bytes + 8), abs=512)
    assert sizes[100] - sizes[10] == pytest.approx(90 * (row_bytes + 8), abs=512)
    assert whole - sizes[10] > 0.99 * (611 + 9_742) * row_bytes
    with pytest.raises(ValueError, match="not a sparse table"):
        write_bundle(rec, 0, [], tmp_path / "bad.tar", version=1, rows={"blocks.head.weight": [0]})
    with pytest.raises(ValueError, match="outside"):
        write_bundle(rec, 0, [], tmp_path / "bad.tar", version=1, rows={item: [9_742]})


def test_cli_rows_plans_and_writes_the_declared_submodel(tmp_path):
    """``edgetrain bundle --rows``: the plan counts the declared rows only and the bundle carries only them."""
    import json

    user, item = "blocks.embeddings.user.weight", "blocks.embeddings.item.weight"
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({user: [3], item: [1, 2, 5, 8, 13]}))
    out = tmp_path / "rec.tar"
    result = _cli("--model", "recommender", "--budget", "400MiB", "--runtime", "250MiB", "--rows", str(rows),
                  "--out", str(out))
    assert result.exit_code == 0, result.output
    m = load_bundle(out).manifest
    assert {(r.name, r.count, r.num_rows) for r in m.tail.rows} == {(user, 1, 611), (item, 5, 9_742)}
    assert "5 of 9,742 rows" in result.output
    whole = _cli("--model", "recommender", "--budget", "400MiB", "--runtime", "250MiB", "--out", str(tmp_path / "w.tar"))
    assert whole.exit_code == 0, whole.output
    assert load_bundle(tmp_path / "w.tar").manifest.tail.size > 50 * m.tail.size  # the dense layers stay

    # Bad row files get a clear error and write nothing.
    for text, message in (("[1, 2]", "JSON object"), (json.dumps({item: [-1]}), "non-negative"),
                          ("{", "--rows"), (json.dumps({"blocks.head.weight": [0]}), "not sparse tables")):
        rows.write_text(text)
        bad = _cli("--model", "recommender", "--budget", "400MiB", "--runtime", "250MiB", "--rows", str(rows),
                   "--out", str(tmp_path / "bad.tar"))
        assert bad.exit_code == 2 and message in bad.output, (text, bad.output)
        assert not (tmp_path / "bad.tar").exists()
