#!/usr/bin/env python3
"""Checks the Dockerfile against the workspace, since no container engine runs here.

    check-image.py [--dockerfile Dockerfile] [--readme README.md]

1. The dependency-cache stage stubs every target Cargo reads: each library, binary
   and bench of each workspace package (`cargo metadata --no-deps`) has its source file written (by
   `echo ... > PATH` or `touch PATH`) in the RUN that follows `COPY Cargo.toml`,
   and nothing else is stubbed. A missing stub makes `cargo build` fail on the
   manifest; an extra one hides a renamed target.
2. One Rust version: the Dockerfile's `ARG RUST_VERSION`, the workspace's
   `rust-version` and README's `rust:X-bookworm` agree.
3. That version covers the dependencies: no package in the resolved graph
   (`cargo metadata`) declares a higher `rust-version`.
4. The final stage fits Envoy Gateway's rate limit Deployment: it runs as
   65534:65534, its entrypoint is the sluice binary, and `/bin/ratelimit` is that
   binary, or a link to it, in the files it copies from the build stage (the
   build stage's `cp target/dist/sluice` (or `target/release/`) and `ln -s` lines, mapped through the
   final stage's `COPY --from=build`). It runs no command (distroless: nothing to
   write on a read-only root).
Exit status 1 on any error, each printed on its own line.
"""
import argparse
import json
import os
import re
import subprocess
import sys


# Kinds of target Cargo needs on disk to read the manifests: the library, binaries
# and the benches declared with [[bench]]. Integration tests are found by looking,
# so a build without them is fine.
NEEDED_KINDS = {"lib", "bin", "bench"}


def version_tuple(v):
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def host_triple():
    out = subprocess.check_output(["rustc", "-vV"], text=True)
    return next(l.split()[1] for l in out.splitlines() if l.startswith("host:"))


def metadata(no_deps):
    args = ["cargo", "metadata", "--format-version", "1", "--locked"]
    if no_deps:
        args.append("--no-deps")
    else:
        # The image is built for Linux: other platforms' dependencies do not count.
        args += ["--filter-platform", host_triple()]
    return json.loads(subprocess.check_output(args))


def stubs(dockerfile_text):
    """Paths written by the RUN instruction of the dependency-cache stage."""
    lines = dockerfile_text.replace("\\\n", " ").splitlines()
    seen_manifest = False
    for line in lines:
        if line.startswith("COPY") and "Cargo.toml" in line:
            seen_manifest = True
        elif seen_manifest and line.startswith("RUN"):
            written = re.findall(r">\s*(\S+)", line)
            touched = [p for group in re.findall(r"touch\s+((?:[^&;]\S*\s*)+)", line)
                       for p in group.split()]
            return set(written) | set(touched)
    return set()


def stages(text):
    """[(name, [instruction lines])], continuation lines joined."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            m = re.search(r"\s+AS\s+(\S+)", line, re.I)
            out.append((m.group(1) if m else None, []))
        elif out:
            out[-1][1].append(line)
    return out


def image_layout(text):
    """Errors in the final stage's layout (check 4)."""
    errors = []
    st = stages(text)
    if not st:
        return ["no FROM"]
    final = st[-1][1]
    build = {name: lines for name, lines in st[:-1] if name}
    # A stage that is only `FROM ${ARG} AS alias` stands for the stage its ARG names
    # by default (BINARY_FROM=build; scripts/image-test.sh passes another image).
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    for line in text.splitlines():
        m = re.match(r"FROM\s+\$\{(\w+)\}\s+AS\s+(\S+)\s*$", line.strip(), re.I)
        if m and args.get(m.group(1)) in build:
            build[m.group(2)] = build[args[m.group(1)]]
    user = [l.split(None, 1)[1] for l in final if l.upper().startswith("USER ")]
    if user != ["65534:65534"]:
        errors.append(f"final stage runs as {user or 'root'}; want USER 65534:65534 (Envoy Gateway's uid and gid)")
    if any(l.upper().startswith("RUN ") for l in final):
        errors.append("final stage runs a command; it should only copy files")
    # Files the final stage gets: build-stage paths mapped through COPY --from.
    files = {}
    for l in final:
        m = re.match(r"COPY\s+--from=(\S+)\s+(\S+)\s+(\S+)$", l)
        if not m:
            continue
        stage, src, dest = m.groups()
        for run in build.get(stage, []):
            if not run.upper().startswith("RUN "):
                continue
            made = [("file", p) for p in re.findall(r"cp\s+target/(?:release|dist)/sluice\s+(\S+)", run)]
            made += [("link " + t, p) for t, p in re.findall(r"ln\s+-s\s+(\S+)\s+(\S+)", run)]
            for kind, path in made:
                if src.endswith("/") and path.startswith(src):
                    files[dest.rstrip("/") + "/" + path[len(src):]] = kind
                elif path == src:
                    files[dest] = kind
    binaries = {p for p, k in files.items() if k == "file"}
    entry = re.findall(r'ENTRYPOINT\s+\["([^"]+)"', "\n".join(final))
    if not entry or entry[0] not in binaries:
        errors.append(f"the entrypoint {entry} is not the sluice binary the final stage copies ({sorted(binaries)})")
    rl = files.get("/bin/ratelimit")
    if rl is None:
        errors.append("the final stage has no /bin/ratelimit (Envoy Gateway's command)")
    elif rl != "file" and rl.split(" ", 1)[1] not in binaries:
        errors.append(f"/bin/ratelimit is a {rl}, which is not the sluice binary")
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dockerfile", default="Dockerfile")
    ap.add_argument("--readme", default="README.md")
    args = ap.parse_args()
    errors = []

    meta = metadata(no_deps=True)
    root = meta["workspace_root"]
    members = set(meta["workspace_members"])
    targets = set()
    versions = set()
    for pkg in meta["packages"]:
        if pkg["id"] not in members:
            continue
        versions.add(pkg.get("rust_version"))
        for t in pkg["targets"]:
            if not NEEDED_KINDS & set(t["kind"]):
                continue
            targets.add(os.path.relpath(t["src_path"], root))
    if len(versions) != 1 or None in versions:
        errors.append(f"workspace packages declare rust-version {sorted(map(str, versions))}; want one")
    declared = next(iter(versions)) if versions else None

    text = open(args.dockerfile).read()
    stubbed = stubs(text)
    for t in sorted(targets - stubbed):
        errors.append(f"{args.dockerfile}: the dependency stage has no stub for target {t}")
    for t in sorted(stubbed - targets):
        errors.append(f"{args.dockerfile}: the dependency stage stubs {t}, which is no target")

    errors += [f"{args.dockerfile}: {e}" for e in image_layout(text)]

    arg = re.search(r"^ARG RUST_VERSION=(\S+)", text, re.M)
    if not arg:
        errors.append(f"{args.dockerfile}: no ARG RUST_VERSION")
    elif declared and arg.group(1) != declared:
        errors.append(f"{args.dockerfile}: RUST_VERSION {arg.group(1)}, Cargo.toml rust-version {declared}")
    readme = re.findall(r"rust:(\d+\.\d+(?:\.\d+)?)-bookworm", open(args.readme).read())
    if not readme:
        errors.append(f"{args.readme}: names no rust:X-bookworm builder image")
    for v in readme:
        if declared and v != declared:
            errors.append(f"{args.readme}: names rust:{v}, Cargo.toml rust-version {declared}")

    if declared:
        for pkg in metadata(no_deps=False)["packages"]:
            need = pkg.get("rust_version")
            if need and version_tuple(need) > version_tuple(declared):
                errors.append(f"{pkg['name']} {pkg['version']} needs Rust {need}; rust-version is {declared}")

    for e in errors:
        print(e)
    if errors:
        return 1
    print(f"image checks: {len(targets)} targets stubbed, Rust {declared} covers every dependency")
    return 0


if __name__ == "__main__":
    sys.exit(main())
