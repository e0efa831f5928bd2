#!/usr/bin/env python3
"""The crate map in docs/ARCHITECTURE.md against the crates' real dependencies.

For every crate in the map's table, its direct normal dependencies on the project's own crates
(read with `cargo metadata`; dev- and build-dependencies do not count, optional ones do) must be
exactly the project crates its "depends on" column names. And no crate may depend on a crate the
table lists after it: the table lists crates bottom-up, so that order is the one way
dependencies flow. Exit status 1, with one line per mismatch, when either fails.
"""

import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "ARCHITECTURE.md"
OUTSIDE = "outside the workspace"


def metadata(manifest):
    """`cargo metadata` of one workspace, offline when the lock file allows it."""
    base = ["cargo", "metadata", "--format-version", "1", "--no-deps", "--manifest-path", str(manifest)]
    last = None
    for cmd in (base + ["--offline"], base):
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if run.returncode == 0:
            return json.loads(run.stdout)
        last = run.stderr.strip()
    sys.exit(f"check-layers: `cargo metadata` failed for {manifest}:\n{last}")


def table_rows():
    """The crate table's rows in order: (package, directory cell, depends-on cell)."""
    rows, in_table = [], False
    for line in MAP.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| crate |"):
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            break
        if set(cells[0]) <= set("-: "):
            continue  # the header's separator
        name = re.fullmatch(r"`([^`]+)`", cells[0])
        if not name or len(cells) < 4:
            sys.exit(f"check-layers: a row of the crate table in {MAP.relative_to(ROOT)} is not "
                     f"`| \\`crate\\` | \\`directory\\` | job | depends on |`: {line}")
        rows.append((name.group(1), cells[1], cells[-1]))
    if not rows:
        sys.exit(f"check-layers: no crate table (a `| crate | ...` header) in {MAP.relative_to(ROOT)}")
    return rows


def short_name(directory_cell):
    """`crates/exec` -> `exec`, `fuzz/` (outside ...) -> `fuzz`: the names the column uses."""
    path = re.search(r"`([^`]+)`", directory_cell)
    path = path.group(1) if path else directory_cell.split()[0]
    return pathlib.PurePosixPath(path.rstrip("/")).name


def declared(cell, by_short):
    """The project crates a "depends on" cell names (annotations in parentheses dropped,
    third-party names ignored)."""
    cell = re.sub(r"\([^)]*\)", "", cell)
    names = set()
    for word in re.split(r"[,;]", cell):
        word = word.strip().strip("`")
        if word in by_short:
            names.add(by_short[word])
    return names


def actual(manifest_dir):
    """package name -> its direct normal dependencies (all of them, by package name)."""
    meta = metadata(manifest_dir / "Cargo.toml")
    members = set(meta["workspace_members"])
    deps = {}
    for pkg in meta["packages"]:
        if pkg["id"] in members:
            deps[pkg["name"]] = {d["name"] for d in pkg["dependencies"] if d["kind"] is None}
    return deps


def main():
    rows = table_rows()
    order = [pkg for pkg, _, _ in rows]
    by_short = {short_name(d): pkg for pkg, d, _ in rows}
    by_short.update({pkg: pkg for pkg in order})
    position = {pkg: i for i, pkg in enumerate(order)}

    real = actual(ROOT)
    # Crates kept outside the workspace (the fuzz targets) have their own manifest.
    for pkg, directory, _ in rows:
        if OUTSIDE in directory and pkg not in real:
            manifest_dir = ROOT / pathlib.PurePosixPath(re.search(r"`([^`]+)`", directory).group(1))
            real.update(actual(manifest_dir))

    problems = []
    for pkg in sorted(set(real) - set(order)):
        problems.append(f"{pkg}: a workspace crate missing from the crate table")
    for pkg, directory, cell in rows:
        if pkg not in real:
            problems.append(f"{pkg}: in the crate table, but no such crate is in the workspace")
            continue
        uses = {d for d in real[pkg] if d in position}
        says = declared(cell, by_short)
        for dep in sorted(uses - says, key=position.get):
            problems.append(f"{pkg}: depends on {dep}, which its \"depends on\" column does not list")
        for dep in sorted(says - uses, key=position.get):
            problems.append(f"{pkg}: its \"depends on\" column lists {dep}, which it does not depend on")
        for dep in sorted(uses, key=position.get):
            if position[dep] >= position[pkg]:
                problems.append(f"{pkg}: depends on {dep}, which the crate table lists after it "
                                f"(dependencies flow one way: up the table, left in the map)")

    if problems:
        print(f"check-layers: the crate map in {MAP.relative_to(ROOT)} and the crates' Cargo.toml "
              "files disagree:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        print("Update the map (the table's \"depends on\" column, its row order and the diagram "
              "above it) or the code, so that they agree.", file=sys.stderr)
        return 1
    print(f"check-layers: {len(order)} crates match the crate map, every dependency pointing up the table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
