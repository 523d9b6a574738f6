"""Builds single-binary images locally: no registry serves images here.

`pause`: the pod sandbox image.

A static C program that sleeps until SIGTERM/SIGINT and reaps children (what upstream's
build/pause/linux/pause.c does), packed as a docker-archive that `ctr images import` loads.
`apicheck`: a static Go program (tests/cluster/apicheck) that GETs /version in-cluster.
`binary`: an existing static binary at a path of the image (kube-scheduler-image.sh: the second
scheduler's image, from the cluster's own kube-scheduler build).
Usage: pause_image.py OUT.tar IMAGE_REF [pause|apicheck]
       pause_image.py OUT.tar IMAGE_REF binary SOURCE PATH_IN_IMAGE
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PAUSE_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void sigdown(int signo) { (void)signo; _exit(0); }
static void sigreap(int signo) { (void)signo; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction down = {.sa_handler = sigdown}, reap = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &down, NULL);
    sigaction(SIGTERM, &down, NULL);
    sigaction(SIGCHLD, &reap, NULL);
    for (;;) pause();
}
"""


def build(out: Path, ref: str, program: str = "pause") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / program
        if program == "pause":
            src = Path(tmp) / "pause.c"
            src.write_text(PAUSE_C)
            subprocess.run(["gcc", "-static", "-Os", "-s", "-o", str(binary), str(src)], check=True)
        else:
            subprocess.run(
                ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(binary), "."],
                cwd=Path(__file__).parent / program,
                env={**os.environ, "CGO_ENABLED": "0"},
                check=True,
            )
        pack(out, ref, binary, f"/{program}", user="65535:65535")


def pack(out: Path, ref: str, binary: Path, path: str, user: str = "") -> None:
    """A docker-archive of one image: the static `binary` at `path` (its entry point), nothing else."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            directory = tarfile.TarInfo("/".join(parts[:depth]))
            directory.type, directory.mode = tarfile.DIRTYPE, 0o755
            t.addfile(directory)
        info = tarfile.TarInfo("/".join(parts))
        info.size, info.mode = binary.stat().st_size, 0o755
        with binary.open("rb") as f:
            t.addfile(info, f)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    image_config: dict[str, object] = {"Entrypoint": [path], "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]}
    if user:
        image_config["User"] = user
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": image_config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(out, "w") as archive:
        for name, data in ((config_name, config), ("layer.tar", layer_bytes), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[3] == "binary":  # OUT.tar IMAGE_REF binary SOURCE PATH_IN_IMAGE
        pack(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[4]), sys.argv[5])
    else:
        build(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "pause")
