"""The code reads in short pieces (no function of the library, the suite, the commands, the benchmarks or the
tooling is longer than 80 lines), its imports run one way, and it installs as a library."""

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile

from conftest import ROOT, TINY, hopper_file, run

LIMIT = 80


def test_no_function_is_longer_than_80_lines():
    tops = ("envs", "dt_primal", "datasets", "commands", "bench", "tools")
    files = sorted(p for top in tops for p in (ROOT / top).rglob("*.py")) + [ROOT / "train.py", ROOT / "evaluate.py"]
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LIMIT
    ]
    assert len(files) > 80 and not long, f"longer than {LIMIT} lines: " + "; ".join(long)


def test_the_wheel_installs_the_library_and_its_commands_and_never_a_top_level_datasets(tmp_path):
    """``pip install`` of the wheel installs dt_primal and envs (a top-level ``datasets`` would shadow Hugging
    Face's) and the console scripts, which train, evaluate and export in a folder outside the checkout."""
    src = tmp_path / "src"  # a copy: building in the checkout would leave build/ and *.egg-info there
    for name in ("dt_primal", "envs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)]
    assert subprocess.run(pip, capture_output=True, text=True, timeout=600).returncode == 0
    wheel = next(tmp_path.glob("dt_primal-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"dt_primal", "envs"}
    git = ["git", "-c", "user.name=a", "-c", "user.email=a@b", "-C", str(tmp_path)]  # the user's own repository
    subprocess.run(git + ["init", "-q"], check=True, timeout=60)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "theirs"], check=True, timeout=60)
    venv = tmp_path / "venv"  # its dependencies: this interpreter's (a venv's or the system's), nothing downloaded
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    here = [p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)]  # this interpreter's site-packages
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "dependencies.pth").write_text("\n".join(here) + "\n")
    install = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-deps"]
    install += ["--no-index", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    home = tmp_path / "elsewhere"
    home.mkdir()

    def command(name, *args):
        return subprocess.run([venv / "bin" / name, *map(str, args)], cwd=home, capture_output=True, text=True)

    res = command("dt-primal-train", "--steps", "1", *TINY, "--out", "runs/suite")
    assert res.returncode == 2 and "in a checkout of dt-primal, a dataset of its offline suite" in res.stderr
    data = hopper_file(tmp_path)
    res = command("dt-primal-train", "--dataset", data, "--steps", "3", "--eval-episodes", "1", *TINY, "--out", "run")
    assert res.returncode == 0 and (home / "run" / "eval.json").exists(), res.stderr
    made = json.loads((home / "run" / "eval.json").read_text())["provenance"]  # the version, not their commit
    assert made["versions"]["dt-primal"] == "0.1.0" and made["commit"] is None
    res = command("dt-primal-evaluate", "run/last.pt", "--episodes", "1", "--device", "cpu", "--out", "ev.json")
    assert res.returncode == 0 and "normalised score" in res.stdout, res.stderr
    res = command("dt-primal-export", "--help")
    assert res.returncode == 0 and res.stdout.startswith("usage: dt-primal-export"), res.stderr


# the product's layers, then the benchmarks that measure it and the maintainers' tooling that runs them
LAYERS = {"envs": 0, "dt_primal": 1, "datasets": 2, "commands": 3, "train": 3, "evaluate": 3, "bench": 4, "tools": 5}


def test_imports_run_one_way():
    """envs <- dt_primal <- datasets <- the commands <- bench <- tools: no module imports one of a layer above its
    own, not even inside a function (nothing of the product imports the benchmarks or the GPU window's tooling)."""
    upward = []
    for path in sorted(ROOT.glob("*.py")) + sorted(p for top in LAYERS for p in (ROOT / top).rglob("*.py")):
        own = LAYERS[path.relative_to(ROOT).parts[0].removesuffix(".py")]
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            upward += [
                f"{path.relative_to(ROOT)}:{node.lineno} imports {n}"
                for n in names
                if LAYERS.get(n.split(".")[0], -1) > own
            ]
    assert not upward, "; ".join(upward)


def _imported(path) -> list[tuple[int, str]]:
    """The absolute imports of the module ``path`` (also those inside functions): (line, module), and for
    ``from package import name`` the module ``package.name`` too (it may be one)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def test_the_library_has_no_circle_between_its_modules_and_folders():
    """Inside dt_primal each top-level module and each folder (model/, training/, evaluation/) is one part;
    the imports between parts (also inside functions) form no circle, so that each part builds only on
    parts below it (evaluation/ never on training/, the checkpoint format never on the loop)."""
    lib = ROOT / "dt_primal"
    parts = {
        p.stem if p.is_file() else p.name for p in lib.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }

    def part(module: str) -> str | None:
        names = module.split(".")
        return names[1] if names[0] == "dt_primal" and len(names) > 1 and names[1] in parts else None

    edges = {}
    for path in lib.rglob("*.py"):
        own = path.relative_to(lib).parts[0].removesuffix(".py")
        for line, module in _imported(path):
            if part(module) not in (None, own):
                edges.setdefault(own, {}).setdefault(part(module), f"{path.relative_to(ROOT)}:{line}")
    done, stack = set(), []

    def visit(p):  # depth-first: a part met again on the current path closes a circle
        if p in stack:
            loop = stack[stack.index(p) :] + [p]
            raise AssertionError(" -> ".join(f"{a} ({edges[a][b]})" for a, b in zip(loop, loop[1:])))
        if p not in done:
            stack.append(p)
            for q in edges.get(p, {}):
                visit(q)
            stack.pop()
            done.add(p)

    for p in sorted(parts):
        visit(p)
    assert edges["training"].keys() >= {"evaluation", "files"}  # the test sees the imports it judges


def test_reading_records_needs_neither_torch_nor_the_simulator():
    script = (
        "import sys, commands.sweep.results, commands.sweep.tables, commands.sweep.plots, commands.sweep.records\n"
        "print(sorted({'torch', 'gymnasium', 'mujoco'} & set(sys.modules)))"
    )
    res = run("-c", script, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_the_model_owns_its_config():
    """model/transformer.py builds a DecisionTransformer from its ModelConfig alone: it imports nothing of the
    run's config."""
    tree = ast.parse((ROOT / "dt_primal" / "model" / "transformer.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert "dt_primal.config" not in imported
