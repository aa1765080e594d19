#!/usr/bin/env python3
"""The docker build context, as .dockerignore leaves it: small, and complete for the build.

    build_context.py ROOT MAX_MIB

Walks ROOT applying ROOT/.dockerignore the way Docker reads it (patterns relative to the root,
`*` and `?` within one path segment, `**` across segments, a matched directory excludes all
it holds, `!` re-includes, the last matching line wins), then fails when the context exceeds
MAX_MIB, when it holds build output or local state (target/, .git), or when it lacks a file
the image build needs (the workspace manifests, the lock file, what the Dockerfile COPYs).
Standard library only.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

NEVER_IN_CONTEXT = ("target", ".git", ".local")


def read_patterns(root: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per line of .dockerignore, in order."""
    path = root / ".dockerignore"
    if not path.exists():
        return []
    patterns = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        patterns.append((exception, re.compile(to_regex(pattern))))
    return patterns


def to_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def excluded(relative: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether `relative` (or a folder holding it) is excluded; the last match wins."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for exception, regex in patterns:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            result = not exception
    return result


def context_files(root: Path) -> dict[str, int]:
    """Relative path -> size of every file the context would hold."""
    patterns = read_patterns(root)
    can_prune = not any(exception for exception, _ in patterns)
    files = {}
    for directory, subdirs, names in os.walk(root):
        base = Path(directory).relative_to(root).as_posix()
        base = "" if base == "." else base + "/"
        if can_prune:
            subdirs[:] = [d for d in subdirs if not excluded(base + d, patterns)]
        for name in names:
            relative = base + name
            if not excluded(relative, patterns):
                full = Path(directory) / name
                files[relative] = full.lstat().st_size
    return files


def needed_files(root: Path) -> list[str]:
    """The files without which `docker build -f deploy/docker/Dockerfile .` fails."""
    # .cargo/config.toml sets how the receiver's allocator is built.
    needed = ["Cargo.toml", "Cargo.lock", ".cargo/config.toml"]
    workspace = tomllib.loads((root / "Cargo.toml").read_text())["workspace"]
    for member in workspace.get("members", []):
        for folder in sorted(root.glob(member)):
            if (folder / "Cargo.toml").exists():
                needed.append(folder.relative_to(root).as_posix() + "/Cargo.toml")
    dockerfile = (root / "deploy/docker/Dockerfile").read_text()
    for line in dockerfile.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "COPY" and not any(w.startswith("--from") for w in words):
            needed.extend(source for source in words[1:-1] if source != "." and not source.startswith("--"))
    needed.append("migrations")
    return needed


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root, limit_mib = Path(argv[0]).resolve(), float(argv[1])
    files = context_files(root)
    total = sum(files.values())
    failures = []
    if total > limit_mib * 1024 * 1024:
        by_top: dict[str, int] = {}
        for path, size in files.items():
            by_top[path.split("/")[0]] = by_top.get(path.split("/")[0], 0) + size
        largest = sorted(by_top.items(), key=lambda item: -item[1])[:5]
        failures.append(
            f"context is {total / 1048576:.1f} MiB, over {limit_mib:g} MiB; largest: "
            + ", ".join(f"{name} {size / 1048576:.1f} MiB" for name, size in largest)
        )
    for path in files:
        if path.split("/")[0] in NEVER_IN_CONTEXT or "/target/" in f"/{path}":
            failures.append(f"{path} is in the context: add its folder to .dockerignore")
            break
    for path in needed_files(root):
        if path not in files and not any(f.startswith(path + "/") for f in files):
            failures.append(f"{path} is needed by the image build but .dockerignore leaves it out")
    for failure in failures:
        print(f"  FAIL {failure}", file=sys.stderr)
    if not failures:
        print(f"  ok   docker build context: {len(files)} files, {total / 1048576:.1f} MiB "
              f"(limit {limit_mib:g} MiB), nothing from target/ or .git", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
