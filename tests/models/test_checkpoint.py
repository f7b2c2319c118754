import argparse
import os

import pytest
import torch

from irpe.models import CheckpointError, create_model, load_checkpoint, load_checkpoint_with_info

TINY = dict(img_size=32, num_classes=4)


def _randomize(model):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def test_official_format_with_args_loads_without_a_name(tmp_path):
    name = "deit_tiny_patch16_224_ctx_product_50_shared_k"
    model = _randomize(create_model(name))
    path = tmp_path / "official.pth"
    torch.save({"model": model.state_dict(), "optimizer": {"state": {}}, "epoch": 299,
                "args": argparse.Namespace(model=name, lr=1e-3)}, path)
    loaded, info = load_checkpoint_with_info(path)
    assert info.name == name and info.epoch == 299
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_round_trip_bare_state_dict_identical_logits_and_inferred_arch(tmp_path):
    model = _randomize(create_model("deit_small_patch16_224", rpe_on="qkv", rpe_method="cross",
                                    rpe_ratio=20, **TINY))
    path = tmp_path / "bare.pth"
    torch.save(model.state_dict(), path)
    loaded, info = load_checkpoint_with_info(path)
    assert info.config.rpe.on == "qkv" and info.config.rpe.method == "cross" and info.config.num_heads == 6
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_timm_style_plain_deit_and_ddp_prefix(tmp_path):
    model = _randomize(create_model("deit_tiny_distilled_patch16_224", **TINY))
    path = tmp_path / "timm.pth"
    torch.save({"model": {f"module.{k}": v for k, v in model.state_dict().items()}}, path)
    loaded, info = load_checkpoint_with_info(path)
    assert info.config.distilled and not info.config.rpe.on
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_pos_embed_is_resized_for_another_img_size(tmp_path):
    model = _randomize(create_model("deit_tiny_patch16_224", **TINY))
    path = tmp_path / "m.pth"
    torch.save(model.state_dict(), path)
    bigger = load_checkpoint(path, img_size=64)
    assert bigger.pos_embed.shape == (1, 17, 192)
    assert bigger(torch.randn(1, 3, 64, 64)).shape == (1, 4)


def test_strict_mismatch_lists_keys_and_shapes(tmp_path):
    model = create_model("deit_tiny_patch16_224", **TINY)
    sd = model.state_dict()
    sd.pop("head.bias")
    sd["extra.weight"] = torch.zeros(1)
    path = tmp_path / "bad.pth"
    torch.save(sd, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, "deit_tiny_patch16_224", img_size=32, num_classes=5)
    msg = str(e.value)
    assert "head.bias" in msg and "extra.weight" in msg and "head.weight" in msg


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['IRPE_TEST_MARKER']}",))


def test_pickle_payload_is_refused_and_never_runs(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("IRPE_TEST_MARKER", str(marker))
    path = tmp_path / "evil.pth"
    torch.save({"model": create_model("deit_tiny_patch16_224", **TINY).state_dict(), "x": _Payload()}, path)
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"PK\x03\x04truncated"])
def test_corrupt_files_give_clear_errors(tmp_path, content):
    path = tmp_path / "corrupt.pth"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(path)


def test_truncated_real_checkpoint(tmp_path):
    path = tmp_path / "t.pth"
    torch.save(create_model("deit_tiny_patch16_224", **TINY).state_dict(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(path)


def test_ambiguous_bucket_count_names_what_is_missing(tmp_path):
    model = create_model("deit_tiny_patch16_224", rpe_on="k", rpe_method="euc", rpe_ratio=3.0, **TINY)
    path = tmp_path / "euc.pth"
    torch.save(model.state_dict(), path)
    with pytest.raises(ValueError, match="--rpe-method and --rpe-ratio"):
        load_checkpoint(path)
    assert load_checkpoint(path, rpe_method="euc", rpe_ratio=3.0).cfg.rpe.method == "euc"


def test_overrides_recorded_in_args_are_applied(tmp_path):
    name = "deit_tiny_patch16_224_ctx_product_50_shared_k"
    model = _randomize(create_model(name, img_size=32, num_classes=4, rpe_on="qk"))
    path = tmp_path / "trained.pth"
    overrides = {"img_size": 32, "num_classes": 4, "rpe_on": "qk"}
    torch.save({"model": model.state_dict(), "args": argparse.Namespace(model=name, overrides=overrides)}, path)
    loaded, info = load_checkpoint_with_info(path)
    assert info.config.num_classes == 4 and info.config.rpe.on == "qk"
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_recorded_overrides_apply_when_the_stored_name_is_passed_explicitly(tmp_path):
    name = "deit_tiny_patch16_224"
    model = create_model(name, img_size=32, num_classes=3)
    path = tmp_path / "trained.pth"
    torch.save({"model": model.state_dict(),
                "args": argparse.Namespace(model=name, overrides={"img_size": 32, "num_classes": 3})}, path)
    assert load_checkpoint_with_info(path, name)[1].config.num_classes == 3
    assert load_checkpoint_with_info(path, name, num_classes=3)[1].config.img_size == 32


@pytest.mark.parametrize("index", [99_999_999, 1000, 20])
def test_huge_or_sparse_block_index_is_refused_before_building(tmp_path, index):
    import time

    sd = create_model("deit_tiny_patch16_224", **TINY).state_dict()
    sd[f"blocks.{index}.norm1.weight"] = sd["blocks.0.norm1.weight"].clone()
    path = tmp_path / "huge.pth"
    torch.save(sd, path)
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match="block indices"):
        load_checkpoint(path)
    assert time.perf_counter() - start < 10
