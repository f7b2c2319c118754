"""A missing optional dependency is one CLI line naming the extra; --rpe-plugin needs only the [export] extra.

Each case runs the real CLI in a fresh interpreter where the listed modules cannot be imported
(``sys.modules[name] = None`` makes ``import name`` raise ModuleNotFoundError, as on a venv without them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from irpe.extras import GRPC_MODULES, extras_by_distribution, install_line, missing_module_message

ROOT = Path(__file__).resolve().parents[1]
NAME = "deit_tiny_patch16_224_ctx_product_50_shared_k"
PYPROJECT_EXTRAS = ("export", "train", "plugins", "gpu", "dev")


def _cli_code(blocked: list[str], argv: list[str]) -> str:
    return (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            f"from irpe.cli import main\nsys.exit(main({argv!r}))\n")


def _cli(blocked: list[str], argv: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _cli_code(blocked, argv)], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def _assert_one_line(res: subprocess.CompletedProcess, command: str, extra: str, package: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"irpe {command}: error: ") and package in lines[0]
    assert install_line(extra) in lines[0], lines[0]


@pytest.mark.parametrize(("blocked", "argv", "extra", "package"), [
    (["torch"], ["export", "ckpt.pth", "-o", "out"], "export", "torch"),
    (["onnx"], ["export", "ckpt.pth", "-o", "out", "--rpe-plugin"], "export", "onnx"),
    (["matplotlib"], ["visualize", "-o", "out"], "train", "matplotlib"),
    (["torch"], ["train", "--data", "digits", "-o", "out"], "train", "torch"),
], ids=["export-torch", "export-onnx", "train-matplotlib", "train-torch"])
def test_missing_optional_dependency_is_one_line_naming_the_extra(blocked, argv, extra, package, tmp_path):
    _assert_one_line(_cli(blocked, argv, tmp_path), argv[0], extra, package)


@pytest.mark.parametrize(("module", "extra"), [
    ("torch", "export"), ("skimage", "export"), ("onnxscript", "export"), ("sklearn", "train"),
    ("tqdm", "export"), ("triton", "plugins"), ("pytest", "dev"), ("tritonclient.http", "dev")])
def test_every_extra_package_maps_to_its_extra(module, extra):
    msg = missing_module_message(module, "export")
    assert install_line(extra) in msg and "\n" not in msg


def test_the_map_covers_every_extra_of_the_installed_package():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(PYPROJECT_EXTRAS) <= set(declared)
    found = {e for extras in extras_by_distribution().values() for e in extras}
    assert set(PYPROJECT_EXTRAS) <= found, "reinstall the package: its metadata lacks extras from pyproject.toml"


def test_the_install_line_works_from_a_checkout():
    """irpe-deploy is on no package index: the line installs the extra from the checkout."""
    assert install_line("export") == "pip install '.[export]' from the irpe-deploy checkout's root"


def test_no_message_names_a_package_index_install():
    found = [f"{path.relative_to(ROOT)}:{number}" for folder in ("artifact", "bench", "cli", "export", "models",
                                                                 "plugins", "server", "training")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if "install 'irpe-deploy[" in line]
    assert found == [], f"pip install 'irpe-deploy[...]' fails (no index has it): say {install_line('EXTRA')}: {found}"


def test_internal_and_tensorrt_modules():
    assert missing_module_message("irpe.nope", "export") is None  # a bug in irpe itself stays a traceback
    assert "nvcr.io/nvidia/tensorrt" in missing_module_message("tensorrt", "export")
    assert missing_module_message("unheard_of", "serve").endswith("pip install unheard_of")


def test_rpe_plugin_export_with_the_export_extra_alone(tmp_path):
    """No onnxruntime-extensions, no triton, no TensorRT: the plugin graph is written and equals the standard one."""
    import onnx
    import torch

    from irpe.export.parity import ort_session
    from irpe.models import create_model

    torch.manual_seed(0)
    model = create_model(NAME, img_size=32, num_classes=5, rpe_on="qkv").eval()
    torch.save(model.state_dict(), tmp_path / "ckpt.pth")
    common = ["--model", NAME, "--img-size", "32", "--num-classes", "5", "--rpe-on", "qkv"]
    blocked = ["onnxruntime_extensions", "triton", "tensorrt"]
    for out, extra in (("plugin", ["--rpe-plugin"]), ("standard", [])):
        res = _cli(blocked, ["export", "ckpt.pth", "-o", out, *common, *extra], tmp_path)
        assert res.returncode == 0, res.stderr
    meta = json.loads((tmp_path / "plugin" / "model.json").read_text())
    assert meta["rpe_plugin"] is True and meta["parity"]["passed"] is True
    proto = onnx.load(str(tmp_path / "plugin" / "model.onnx"))
    assert {n.op_type for n in proto.graph.node if n.domain == "irpe"} == {"RPEIndex", "RPEBucketSum"}
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32), dtype=np.float32)
    got = ort_session(tmp_path / "plugin" / "model.onnx", rpe_plugin=True).run(None, {"images": x})[0]
    want = ort_session(tmp_path / "standard" / "model.onnx").run(None, {"images": x})[0]
    assert np.abs(got - want).max() <= 1e-4


def test_gpu_extra_is_named_when_onnxruntime_has_no_cuda():
    import onnxruntime as ort

    from irpe.server.engines.onnxruntime import EngineError, OrtEngine

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("no GPU: this onnxruntime has CUDA, the message is for CPU-only builds")
    with pytest.raises(EngineError, match=re.escape(f"{install_line('gpu')} (onnxruntime-gpu)")):
        OrtEngine(Path("unused.onnx"), None, device="cuda", threads=1, max_batch=1)


@dataclass(frozen=True)
class ExtraCase:
    """How a user meets a missing extra: the CLI run with ``blocked`` modules unimportable, and the package its
    one-line error names beside ``pip install '.[EXTRA]'``."""

    blocked: tuple[str, ...]
    argv: tuple[str, ...]
    package: str


# every extra whose packages an irpe command imports within seconds on this machine
CLI_CASES = {
    "export": ExtraCase(("torch",), ("export", "ckpt.pth", "-o", "out"), "torch"),
    "train": ExtraCase(("matplotlib",), ("visualize", "-o", "out"), "matplotlib"),
    "cpu": ExtraCase(("openvino",), ("classify", "img.png", "--model", "digits", "--backend", "openvino"),
                     "openvino"),
    # onnxruntime-gpu installs the same module as onnxruntime: what is missing is its CUDA provider
    "gpu": ExtraCase((), ("classify", "img.png", "--model", "digits", "--device", "cuda"), "onnxruntime-gpu"),
    "grpc": ExtraCase(("grpc",), ("serve", "digits", "--port", "0", "--grpc-port", "0"), "grpcio"),
}
# extras that no command reaches here within seconds: the module, the command, and why; the CLI line is the
# message irpe.extras writes for that module (tests below assert it)
MESSAGE_CASES = {
    "bench-cpu": ("nncf", "bench", "irpe bench cpu exports DeiT-S first (minutes), then notes the missing anchor"),
    "plugins": ("triton", "export", "only after TensorRT imports (a GPU host) does export import triton"),
    "dev": ("pytest", None, "developer tools: no irpe command imports them"),
    "ray": ("ray", None, "Ray's own `serve run irpe.ray:app` imports it; no irpe command does"),
}
# tracing is optional: a missing [otel] extra is a warning line at start-up, and the server runs on
WARNING_CASES = {"otel": ("opentelemetry.sdk", "opentelemetry.exporter")}


def test_every_extra_of_pyproject_has_a_case():
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    covered = set(CLI_CASES) | set(MESSAGE_CASES) | set(WARNING_CASES)
    assert covered == declared, f"add a case to tests/test_extras.py for the extras {sorted(declared - covered)}"


def _image(folder: Path) -> None:
    from PIL import Image

    Image.new("RGB", (28, 28), (255, 255, 255)).save(folder / "img.png")


@pytest.mark.parametrize("extra", sorted(CLI_CASES))
def test_each_extra_missing_is_one_cli_line_naming_it(extra, tmp_path):
    case = CLI_CASES[extra]
    if extra == "gpu":
        import onnxruntime as ort

        if "CUDAExecutionProvider" in ort.get_available_providers():
            pytest.skip("this onnxruntime has CUDA: the [gpu] extra is installed")
    _image(tmp_path)
    res = _cli(list(case.blocked), list(case.argv), tmp_path, timeout=120)
    _assert_one_line(res, case.argv[0], extra, case.package)


@pytest.mark.parametrize(("module", "package"), list(zip(GRPC_MODULES, ("grpcio", "protobuf", "tritonclient"),
                                                         strict=True)))
def test_serve_grpc_port_names_the_grpc_extra_for_each_of_its_modules(module, package, tmp_path):
    res = _cli([module], ["serve", "digits", "--port", "0", "--grpc-port", "0"], tmp_path, timeout=120)
    _assert_one_line(res, "serve", "grpc", package)
    assert "pip install grpc " not in res.stderr and not res.stderr.rstrip().endswith("pip install grpc")


@pytest.mark.parametrize("extra", sorted(MESSAGE_CASES))
def test_extras_no_quick_command_reaches_have_their_line(extra):
    module, command, _why = MESSAGE_CASES[extra]
    msg = missing_module_message(module, command)
    assert install_line(extra) in msg and "\n" not in msg, msg


def test_missing_otel_extra_is_a_startup_warning_naming_it(tmp_path):
    blocked = list(WARNING_CASES["otel"])
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    proc = subprocess.Popen([sys.executable, "-c", _cli_code(blocked, ["serve", "digits", "--port", "0"])],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path, env=env)
    killer = threading.Timer(90, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "listening on" in line:
                break
    finally:
        killer.cancel()
        proc.terminate()
        proc.wait(timeout=30)
    assert any("listening on" in ln for ln in lines), "".join(lines)
    warning = [ln for ln in lines if "OTEL_EXPORTER_OTLP_ENDPOINT" in ln]
    assert len(warning) == 1 and install_line("otel") in warning[0], "".join(lines)


@pytest.mark.parametrize(("module", "command", "extra", "package"), [
    ("grpc", "serve", "grpc", "grpcio"), ("google.protobuf", "serve", "grpc", "protobuf"),
    ("tritonclient.grpc", "serve", "grpc", "tritonclient"), ("tritonclient", "bench", "grpc", "tritonclient"),
    ("opentelemetry.sdk.trace", "serve", "otel", "opentelemetry-sdk"),
    ("opentelemetry.exporter.otlp.proto.http", "serve", "otel", "opentelemetry-exporter-otlp-proto-http"),
    ("openvino", "serve", "cpu", "openvino"), ("openvino", "export", "export", "openvino"),
])
def test_dotted_and_shared_modules_name_the_right_extra_and_package(module, command, extra, package):
    msg = missing_module_message(module, command)
    assert f"needs {package} " in msg and install_line(extra) in msg, msg
