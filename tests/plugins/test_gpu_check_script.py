"""scripts/gpu-check.sh as on a lent GPU machine: a plain checkout, a Python that has only the machine's packages
(numpy, onnx, onnxruntime, torch, triton and what they require), the project not installed.

The environment is a virtual environment whose one ``.pth`` file points at a folder of links to exactly those
distributions in this test run's own site-packages, so it takes a second to make and installs nothing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from irpe.plugins import gpu_check

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
MACHINE_PACKAGES = ("numpy", "onnx", "onnxruntime", "torch", "triton")  # what a lent GPU machine has (no CuPy here)
NOT_ON_THE_MACHINE = ("PIL", "fastapi", "skimage", "onnxscript", "orjson", "irpe")


def distribution_closure(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` need, with their requirements (markers evaluated, no extras)."""
    todo, found = list(names), {}
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in found:
            continue
        found[key] = importlib.metadata.distribution(key)
        for line in found[key].requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


def machine_python(root: Path, packages: tuple[str, ...]) -> Path:
    """A venv under ``root`` that sees only ``packages`` (and their requirements) through one ``.pth`` file."""
    links = root / "machine-site-packages"
    links.mkdir(parents=True)
    for dist in distribution_closure(packages):
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not (links / top).exists():
                (links / top).symlink_to(Path(dist.locate_file(top)))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=60)
    site_packages = next((root / "venv" / "lib").glob("python3*/site-packages"))
    (site_packages / "machine-packages.pth").write_text(f"{links}\n", encoding="utf-8")
    return root / "venv" / "bin" / "python"


def importable(python: Path, names: tuple[str, ...], cwd: Path) -> dict[str, bool]:
    code = "import importlib.util, sys; print(*[importlib.util.find_spec(n) is not None for n in sys.argv[1:]])"
    res = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, cwd=cwd, timeout=60,
                         check=True)
    return dict(zip(names, (word == "True" for word in res.stdout.split()), strict=True))


def run_script(python: Path, outdir: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the script from the checkout's root (whose irpe/ folder must not shadow the package)."""
    res = subprocess.run([str(SCRIPT), *args, str(outdir)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": str(python), "HOME": str(outdir.parent)})
    return res, [line for line in res.stdout.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")]


def assert_files_agree(outdir: Path, lines: list[str]) -> dict:
    doc = json.loads((outdir / gpu_check.JSON_NAME).read_text(encoding="utf-8"))
    text = (outdir / gpu_check.TEXT_NAME).read_text(encoding="utf-8").splitlines()
    assert doc["finished"] and doc["running"] is None and doc["exit_status"] == 0
    from_json = [gpu_check.StepResult(s["name"], gpu_check.Status(s["status"]), s["seconds"], s["detail"],
                                      s["figures"]).line() for s in doc["steps"]]
    assert from_json == lines == [line for line in text if line[:4] in ("PASS", "FAIL", "SKIP")]
    return doc


@pytest.fixture(scope="module")
def machine(tmp_path_factory) -> Path:
    return machine_python(tmp_path_factory.mktemp("gpu-machine"), MACHINE_PACKAGES)


def test_the_machine_python_has_only_the_machine_packages(machine, tmp_path):
    seen = importable(machine, MACHINE_PACKAGES + NOT_ON_THE_MACHINE, cwd=tmp_path)
    assert seen == {name: name in MACHINE_PACKAGES for name in seen}


def test_every_step_passes_or_skips_with_a_reason_and_both_files_agree(machine, tmp_path):
    outdir = tmp_path / "out"
    res, lines = run_script(machine, outdir, "--quick")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not re.search(r"Traceback|ImportError|ModuleNotFoundError", res.stdout + res.stderr)
    assert [line.split(" (")[0][5:] for line in lines] == [name for name, _ in gpu_check.steps()]
    assert all(line[:4] in ("PASS", "SKIP") and line.split("): ", 1)[1] for line in lines), res.stdout
    assert "no CUDA GPU visible to torch" in lines[1]  # numpy, torch and triton imported; only the GPU is missing
    doc = assert_files_agree(outdir, lines)
    assert doc["profile"]["name"] == "quick"
    assert doc["packages"]["torch"].startswith("torch ") and doc["packages"]["cupy"] == "not installed"


def test_the_gpu_steps_code_runs_on_the_cpu_with_only_the_machine_packages(machine, tmp_path):
    """--device cpu: the Triton kernels (interpreter) and the exported model through ONNX Runtime against PyTorch,
    the same imports as on a GPU, so a module the machine lacks on that path fails here."""
    outdir = tmp_path / "out"
    res, lines = run_script(machine, outdir, "--device", "cpu")
    assert res.returncode == 0, res.stdout + res.stderr
    status = {line.split(" (")[0][5:]: line[:4] for line in lines}
    assert status["Triton kernels vs NumPy"] == status["PyTorch CUDA vs ONNX Runtime CPU"] == "PASS", res.stdout
    assert set(status.values()) == {"PASS", "SKIP"}
    steps = assert_files_agree(outdir, lines)["steps"]
    assert set(steps[1]["figures"]) == {"float32", "float16"}  # both dtypes at every corner, with us/call
    figures = steps[3]["figures"]
    assert figures["float32"]["max_abs_diff"] <= figures["float32"]["bound"] and figures["float32"]["img_per_s"]
    assert 0 < figures["float16"]["max_abs_diff"] <= figures["float16"]["bound"]
    assert steps[2]["detail"] == "launching PTX needs a CUDA GPU (this run uses cpu)"


@pytest.mark.parametrize(("packages", "reason"), [((), "numpy is not installed"),
                                                   (("numpy",), "is not installed (pip install")])
def test_with_fewer_packages_every_step_skips_and_names_what_is_missing(tmp_path, packages, reason):
    python = machine_python(tmp_path / "python", packages)
    outdir = tmp_path / "out"
    res, lines = run_script(python, outdir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(lines) == len(gpu_check.steps()) and all(line.startswith("SKIP") for line in lines), res.stdout
    assert all(reason in line for line in lines[1:]), res.stdout
    assert assert_files_agree(outdir, lines)["profile"]["name"] == "full"


def test_outdir_is_required_and_the_usage_says_so(machine, tmp_path):
    res = subprocess.run([str(SCRIPT)], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": str(machine), "TMPDIR": str(tmp_path)})
    assert res.returncode == 2 and "the following arguments are required: outdir" in res.stderr
    assert not list(tmp_path.iterdir())  # the temporary package links were made here, and are gone



def load_checkout_package():
    spec = importlib.util.spec_from_file_location("checkout_package", ROOT / "scripts" / "checkout_package.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_links_follow_pyproject_with_and_without_tomllib(monkeypatch, tmp_path):
    checkout_package = load_checkout_package()
    mapping = checkout_package.package_dirs(ROOT / "pyproject.toml")
    assert mapping["irpe.plugins"] == "plugins" and mapping["irpe"] == "cli"
    monkeypatch.setitem(sys.modules, "tomllib", None)  # Python 3.10 has none: the one-line pattern reads it
    assert checkout_package.package_dirs(ROOT / "pyproject.toml") == mapping
    checkout_package.build(tmp_path)
    for name, folder in mapping.items():
        assert (tmp_path.joinpath(*name.split(".")) / "__init__.py").resolve() == ROOT / folder / "__init__.py"
    with pytest.raises(FileExistsError, match="give checkout_package.py a new, empty folder"):
        checkout_package.build(tmp_path)
