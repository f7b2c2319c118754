"""``irpe bench serve --frontend``: where a request's CPU goes, old path vs new, 1..N front-end processes.

Every server variant runs at once on its own port; rounds interleave them (fair while other work on the
machine comes and goes). For each variant: answered req/s and the CPU-ms per request of the server's whole
process tree (every thread of every process, from /proc), split per thread kind (``main-loop``: the
event loop, ``irpe-decode``, ``irpe-inference``, ``irpe-frontend``/``irpe-engine`` processes, ...).
Variants: ``baseline`` (another import tree, ``--baseline-pythonpath``), ``single`` (``irpe serve``),
``frontends=N`` (``irpe serve --frontends N``) and ``single xK`` (K images per request: cost per image).
Without ``--artifact`` the near-free model is exported (64-dim, 4 layers, 7x7 grid, 224 px).
Every server runs with the defaults a user gets (the access log on, written to a file) and gets the request
as httpx sends it (:func:`httpx_request`: its headers, the head and each body piece in its own write; issue
31 found the one-write request of :func:`multipart_images` cheaper to serve than what clients send).
"""

from __future__ import annotations

import collections
import contextlib
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .baseline import SINGLE_PROCESS_BASELINE, import_tree
from .floors import format_floors, measure_floors
from .loadgen import run_load
from .serve import _free_port, sample_jpeg, server_process

NEAR_FREE = "deit_micro_patch4_32_ctx_product_shared_k"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Variant:
    """One server to start: a label, ``irpe`` arguments, extra environment, images per request."""

    label: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    images: int = 1
    command: list[str] | None = None  # instead of ``irpe serve ARTIFACT --port PORT ... args``


@dataclass
class Row:
    """What one variant did over every round."""

    label: str
    images: int = 1
    answered: int = 0
    seconds: float = 0.0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    cpu: collections.Counter = field(default_factory=collections.Counter)

    @property
    def rps(self) -> float:
        return self.answered / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms(self) -> float:
        """Server CPU-ms (whole process tree) per answered request."""
        return 1e3 * sum(self.cpu.values()) / self.answered if self.answered else float("nan")


def tree_pids(root: int) -> list[int]:
    """``root`` and every descendant process (from /proc)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def thread_cpu(root: int) -> collections.Counter:
    """CPU seconds per thread kind (OS thread name without trailing digits) over a process tree."""
    out: collections.Counter = collections.Counter()
    for pid in tree_pids(root):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError):
                    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                    name = stat[stat.index("(") + 1:stat.rindex(")")].rstrip("0123456789_-") or "?"
                    fields = stat.rsplit(")", 1)[1].split()
                    out[name] += (int(fields[11]) + int(fields[12])) / _TICK
    return out


def httpx_request(path: str, host: str, data: bytes, images: int) -> list[bytes]:
    """``POST path`` with ``images`` multipart ``file`` parts exactly as httpx sends it (what ``curl -F`` and
    most Python clients send): its default headers, and one write for the head and one per body piece."""
    import httpx

    with httpx.Client() as client:
        req = client.build_request("POST", f"http://{host}{path}",
                                   files=[("file", ("image.jpg", data, "image/jpeg"))] * images)
    head = b"".join([b"POST %s HTTP/1.1\r\n" % req.url.raw_path, *(b"%s: %s\r\n" % kv for kv in req.headers.raw),
                     b"\r\n"])
    return [head, *req.stream]  # type: ignore[list-item]


def multipart_images(path: str, host: str, data: bytes, images: int) -> bytes:
    """A complete HTTP/1.1 POST with ``images`` multipart ``file`` parts."""
    b = uuid.uuid4().hex
    part = (f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"i.jpg\"\r\n"
            "Content-Type: image/jpeg\r\n\r\n").encode() + data + b"\r\n"
    body = part * images + f"--{b}--\r\n".encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: multipart/form-data; boundary={b}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@contextlib.contextmanager
def _started(v: Variant, artifact: Path, port: int, server_args: tuple[str, ...]):  # type: ignore[no-untyped-def]
    script = Path(__file__).with_name("threadnames.py")
    args = [str(script), "serve", str(artifact), "--port", str(port), *server_args, *v.args]  # access log on
    if v.command is not None:
        args = [*v.command, str(port)]
    with tempfile.TemporaryFile() as log, server_process(args, port, env=v.env, stop_timeout=60, stderr=log) as proc:
        yield proc


def bench_frontend(artifact: Path, variants: list[Variant], *, requests: int = 600, concurrency: int = 32,
                   rounds: int = 3, server_args: tuple[str, ...] = ()) -> list[Row]:
    """Start every variant, then ``rounds`` x (each variant: ``requests / rounds`` requests)."""
    payload = sample_jpeg()
    rows = [Row(v.label, v.images) for v in variants]
    with contextlib.ExitStack() as stack:
        servers = []
        for v in variants:
            port = _free_port()
            servers.append((port, stack.enter_context(_started(v, artifact, port, server_args)).pid))
        for _ in range(rounds):
            for v, row, (port, pid) in zip(variants, rows, servers, strict=True):
                req = httpx_request("/classify?top_k=5", f"127.0.0.1:{port}", payload, v.images)
                run_load("127.0.0.1", port, req, concurrency, concurrency)  # warm connections
                before = thread_cpu(pid)
                r = run_load("127.0.0.1", port, req, max(1, requests // rounds), concurrency)
                after = thread_cpu(pid)
                row.answered += len(r.latencies)
                row.seconds += r.seconds
                row.statuses.update(r.statuses)
                row.cpu.update({k: after[k] - before.get(k, 0.0) for k in after})
    return rows


def format_rows(rows: list[Row]) -> str:
    """The table: req/s, CPU-ms per request and per image, and the split per thread kind."""
    kinds = sorted({k for r in rows for k, v in r.cpu.items() if r.answered and 1e3 * v / r.answered >= 0.05})
    head = f"{'server':<14} {'img/req':>7} {'req/s':>7} {'CPU-ms/req':>10} {'CPU-ms/img':>10} {'non-200':>7}  "
    lines = [head + "  ".join(f"{k[:14]:>14}" for k in kinds)]
    for r in rows:
        split = "  ".join(f"{1e3 * r.cpu.get(k, 0.0) / max(r.answered, 1):>14.2f}" for k in kinds)
        bad = sum(v for s, v in r.statuses.items() if s != 200)
        lines.append(f"{r.label:<14} {r.images:>7} {r.rps:>7.1f} {r.cpu_ms:>10.2f} {r.cpu_ms / r.images:>10.2f} "
                     f"{bad:>7}  {split}")
    return "\n".join(lines)


def default_variants(frontends: list[int], baseline_pythonpath: str | None, images: list[int],
                     floor: bool = True) -> list[Variant]:
    """baseline (optional), single, single without its access log (the log's cost), single xK for each K > 1,
    frontends=N for each N, the HTTP floor."""
    out = [Variant("baseline", [], {"PYTHONPATH": baseline_pythonpath})] if baseline_pythonpath else []
    out.append(Variant("single", []))
    out.append(Variant("single no-log", ["--log-level", "warning"]))  # the access line is INFO
    out += [Variant(f"single x{k}", [], images=k) for k in images if k > 1]
    out += [Variant(f"frontends={n}", ["--frontends", str(n)]) for n in frontends]
    if floor:
        out.append(Variant("http floor", [], command=[str(Path(__file__).with_name("empty_asgi.py"))]))
    return out


def build_near_free(out_dir: Path, img_size: int = 224, patch_size: int = 32) -> Path:
    """Export the near-free model (random weights; needs torch) at ``img_size`` px in ``patch_size`` patches."""
    import torch

    from irpe.export import ExportOptions, export_artifact
    from irpe.models import create_model

    torch.manual_seed(0)
    overrides = {"img_size": img_size, "patch_size": patch_size}
    ckpt = out_dir / "near-free.pth"
    torch.save(create_model(NEAR_FREE, **overrides).state_dict(), ckpt)
    return Path(export_artifact(ckpt, out_dir / "artifact",
                                ExportOptions(name=NEAR_FREE, overrides=overrides, progress=False)))


def run_frontend_bench(artifact: str | None, requests: int, concurrency: int, frontends: list[int],
                       baseline_pythonpath: str | None = None, images: list[int] | None = None,
                       server_args: tuple[str, ...] = (), baseline_ref: str = SINGLE_PROCESS_BASELINE,
                       rounds: int = 3) -> list[Row]:
    """Entry point of ``irpe bench serve --frontend``: the table, the before/after ratio and the floors."""
    with tempfile.TemporaryDirectory(prefix="irpe-bench-fe-") as tmp:
        if artifact is None:
            print(f"exporting the near-free model ({NEAR_FREE} at 224 px, 7x7 grid) ...", flush=True)
            path = build_near_free(Path(tmp))
        else:
            path = Path(artifact)
        if baseline_pythonpath is None and baseline_ref != "none":
            tree = import_tree(baseline_ref, Path(tmp) / "baseline")
            baseline_pythonpath = str(tree) if tree else None
            print(f"baseline: commit {baseline_ref[:12]}" if tree else f"baseline: {baseline_ref!r} is not "
                  "available here (not a git checkout, unknown commit or no C compiler); served without it")
        variants = default_variants(frontends, baseline_pythonpath, images or [])
        rows = bench_frontend(path, variants, requests=requests, concurrency=concurrency, rounds=rounds,
                              server_args=server_args)
        floors = measure_floors(path, sample_jpeg())
    print(f"{requests} requests per server at concurrency {concurrency}, 512x512 JPEG as httpx sends it, {rounds} "
          "interleaved rounds, access log on; CPU = the server's whole process tree")
    print(format_rows(rows))
    by = {r.label: r for r in rows}
    if "baseline" in by:
        for r in rows[1:]:
            if r.label != "http floor" and r.answered:
                print(f"{r.label}: {r.cpu_ms / r.images:.2f} CPU-ms per image = "
                      f"{r.cpu_ms / r.images / by['baseline'].cpu_ms:.2f} x baseline")
    print("floors (one thread, no HTTP):")
    print(format_floors(floors))
    return rows
