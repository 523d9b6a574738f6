#!/usr/bin/env bash
# rootfs.sh deps|code SERVICE OUT: run by services/Dockerfile inside its build stage. Makes in OUT the
# whole root filesystem of SERVICE's image (a directory under services/), and nothing else, in two
# steps, each a layer of its own, so that a change to the project's code rebuilds only the second:
#   deps  /opt/neuron, a venv with the service's third-party packages (/src/deps/SERVICE.txt, from
#         services/image_requirements.py), offline from /wheels when that holds wheels; the
#         interpreter, its standard library minus what no service imports (tests, GUI, IDE,
#         installers, sqlite, dbm, curses), and exactly the shared libraries all of it links
#         against; /etc/passwd and /etc/group naming root and nobody, an ld.so.cache, an empty /tmp;
#   code  the libraries of libs/ the service depends on and the service itself, into that venv. A
#         package the code would bring that the deps step did not install fails the build: the
#         list and the pyproject.toml files disagree.
# The image's venv never holds pip or setuptools: a second venv in the build stage, /opt/build,
# installs into it (pip --python) and builds the project's wheels. Every module of the service is
# then imported inside OUT, so a library left out fails the build here rather than the pod later.
set -euo pipefail
step=${1:-}
service=${2:-}
out=${3:?usage: rootfs.sh deps|code SERVICE OUT}
src=/src
venv=/opt/neuron
build=/opt/build
case $step in deps | code) ;; *) echo "rootfs.sh: the first argument is deps or code (got '$step')" >&2; exit 1 ;; esac
[ -n "$service" ] && [ -f "$src/deps/$service.txt" ] \
  || { echo "rootfs.sh: build with --build-arg SERVICE=<a directory under services/>, after" \
    "python3 services/image_requirements.py --write build/image-deps (got '$service')" >&2; exit 1; }
pip=("$build/bin/python3" -m pip -q --disable-pip-version-check --no-cache-dir)
offline=(--no-index --find-links /wheels)
site=$(python3 -c 'import sys, sysconfig; print(sysconfig.get_path("purelib", "venv", vars={"base": sys.argv[1]}))' "$venv")
installed() {  # the distributions in the venv, one normalized name a line
  "$venv/bin/python3" -c 'import importlib.metadata, sys
sys.path.insert(0, "/src")
from verify_wheels import normalize
print("\n".join(sorted({normalize(d.metadata["Name"]) for d in importlib.metadata.distributions()})))'
}
# Bytecode is compiled here, because the root is read-only in a pod: without it every start compiles
# whatever it imports, which for the Kubernetes client alone (the `helm test` pods', and the
# services' loaders for exec-plugin kubeconfigs) takes 3 s and peaks at 140 MB. Unchecked-hash
# bytecode: Python never compares it with the source's time, and its bytes do not depend on file times.
compile=(python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash -s "$out" -p /)

# === code ========================================================================================
if [ "$step" = code ]; then
  # The project's wheels, built with the build venv's setuptools: an isolated build environment
  # per library took 20 s an image.
  "${pip[@]}" wheel --no-build-isolation --no-deps -w /tmp/project "$src"/libs/*/ "$src/services/$service"
  name=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["name"])' \
    "$src/services/$service/pyproject.toml")
  "${pip[@]}" --python "$venv/bin/python3" install --no-compile "${offline[@]}" --find-links /tmp/project \
    -c "$src/constraints.txt" "$name"
  installed >/tmp/installed
  python3 - "$build/deps-installed" /tmp/installed /tmp/project >/tmp/added <<'PY'
import pathlib, sys
sys.path.insert(0, "/src")
from verify_wheels import normalize
before, now = (set(pathlib.Path(p).read_text().split()) for p in sys.argv[1:3])
project = {normalize(w.name.split("-")[0]) for w in pathlib.Path(sys.argv[3]).glob("*.whl")}
strays = sorted(now - before - project)
if strays:
    sys.exit(f"rootfs.sh: the code step installed third-party packages the deps step did not: {' '.join(strays)}. "
             "services/image_requirements.py and the pyproject.toml files disagree")
print("\n".join(sorted(now - before)))
PY
  mapfile -t added </tmp/added
  # Each added distribution's files (its RECORD: packages, metadata, console scripts) into OUT's
  # venv, then compiled; the deps step's files there stay as they are.
  "$venv/bin/python3" - "$out" "${added[@]}" <<'PY' | "${compile[@]}" -i -
import importlib.metadata, pathlib, shutil, sys
out = pathlib.Path(sys.argv[1])
for name in sys.argv[2:]:
    for file in importlib.metadata.distribution(name).files or ():
        source = pathlib.Path(file.locate()).resolve()
        target = out / source.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        if target.suffix == ".py":
            print(target)
PY
  # --- check: every module of the service imports inside the new root --------------------------
  package=$(find "$src/services/$service/src" -mindepth 1 -maxdepth 1 -type d ! -name '*.egg-info' -printf '%f\n')
  chroot "$out" /opt/neuron/bin/python3 -B -c '
import importlib, pkgutil, sys
package = importlib.import_module(sys.argv[1])
for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    importlib.import_module(module.name)
' "$package"
  exit 0
fi

# === deps ========================================================================================
python3 -m venv --without-pip "$venv"
python3 -m venv "$build"
# Nothing third-party is installed but what the lock lists, by digest: the wheels images.sh put in
# the context, or, built without them, the lock's files downloaded here with their hashes checked.
if ! ls /wheels/*.whl >/dev/null 2>&1; then
  mkdir -p /wheels
  "${pip[@]}" download -d /wheels --only-binary=:all: --no-deps --require-hashes -r "$src/image-wheels.lock"
fi
python3 "$src/verify_wheels.py" "$src/image-wheels.lock" /wheels
"${pip[@]}" install --upgrade "${offline[@]}" setuptools  # the lock's (bdist_wheel built in), for the code step's builds
"${pip[@]}" --python "$venv/bin/python3" install --no-compile "${offline[@]}" -c "$src/constraints.txt" \
  -r "$src/deps/$service.txt"
installed >"$build/deps-installed"
# kubernetes' asyncio client (42 MB of the 76 MB package) duplicates the synchronous one the
# `helm test` pods call in the detector's image, and nothing imports it.
rm -rf "$site/kubernetes/aio"
find "$venv" -name __pycache__ -prune -exec rm -rf {} +
# Wheels' extension modules carry symbols nothing here uses (aiohttp's alone are 4 MB of them).
if command -v strip >/dev/null; then
  find "$venv" -name '*.so' -type f -exec strip --strip-unneeded {} +
fi

# --- the interpreter and its standard library --------------------------------------------------
mkdir -p "$out/tmp" "$out/etc" "$out/opt"
chmod 1777 "$out/tmp"
cp -a "$venv" "$out/opt/"
# merged /usr: /lib64/ld-linux-x86-64.so.2, the loader every binary names, goes through these links
for top in /bin /sbin /lib /lib32 /lib64 /libx32; do [ -L "$top" ] && cp -a "$top" "$out/"; done

copy_path() {  # copies a file and every symbolic link that leads to it, each at its resolved directory
  local path=$1 dir at next
  while :; do
    dir=$(readlink -f "$(dirname "$path")")
    at="$dir/$(basename "$path")"
    mkdir -p "$out$dir"
    cp -a "$at" "$out$dir/"
    [ -L "$at" ] || return 0
    next=$(readlink "$at")
    case $next in /*) path=$next ;; *) path=$dir/$next ;; esac
  done
}

copy_path "$venv/bin/python3"   # the venv's python3 is a link to the base's interpreter
stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
dynload=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("DESTSHARED"))')
no_stdlib=(test idlelib tkinter turtledemo turtle.py ensurepip lib2to3 pydoc_data distutils venv sqlite3 dbm curses
  'config-3*' site-packages dist-packages)
no_dynload=('_test*' '_xx*' 'xx*' '_ctypes_test*' _sqlite3 _dbm _gdbm _curses _curses_panel readline _tkinter nis
  _crypt ossaudiodev spwd)
excludes=(--exclude=__pycache__)
for name in "${no_stdlib[@]}"; do excludes+=("--exclude=${stdlib#/}/$name"); done
for name in "${no_dynload[@]}"; do excludes+=("--exclude=${dynload#/}/$name.*"); done
tar -C / "${excludes[@]}" -cf - "${stdlib#/}" | tar -C "$out" -xf -

# --- the shared libraries: what the interpreter and every extension module link against -------
needed=$(find "$out" -type f \( -name '*.so' -o -name '*.so.*' -o -path "$out/usr/*bin/*" \) -print0 \
  | { xargs -0 ldd 2>/dev/null || true; } \
  | awk '/:$/ {next}   # ldd names each file it lists
         /not found/ {print "MISSING " $1; next}
         $2 == "=>" && $3 ~ /^\// {print $3; next}
         $1 ~ /^\// {print $1}' \
  | sort -u)
if grep '^MISSING' <<<"$needed"; then echo "rootfs.sh: unresolved shared libraries" >&2; exit 1; fi
while read -r lib; do copy_path "$lib"; done <<<"$needed"
cp -a /etc/ld.so.conf /etc/ld.so.conf.d "$out/etc/" 2>/dev/null || true
ldconfig -r "$out"

cat >"$out/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
EOF
cat >"$out/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
cat >"$out/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF

# --- what of Debian the image holds, for its SBOM (syft, tools/release.py) -----------------------
# os-release names the distribution, without which syft gives the Debian packages no purl (and a
# vulnerability scanner cannot match them); the dpkg records are the packages' whose files OUT holds.
copy_path /etc/os-release
python3 "$src/debian_inventory.py" "$out"

# --- bytecode of the interpreter and the third-party packages ------------------------------------
# The Kubernetes client keeps its bytecode (25 MB) without its 34 MB of generated source, mostly
# docstrings: a traceback through it shows file and line, not the line's text.
if [ -d "$out$site/kubernetes" ]; then
  "${compile[@]}" -b "$out$site/kubernetes"
  find "$out$site/kubernetes" -name '*.py' -delete
fi
"${compile[@]}" "$out$stdlib" "$out$venv"
