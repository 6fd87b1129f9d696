"""The code reads in short pieces: no function of the library or of the command-line scripts is longer
than 80 lines."""
import ast

from test_train import ROOT

LIMIT = 80


def test_no_function_is_longer_than_80_lines():
    files = sorted((ROOT / "dt_primal").rglob("*.py")) + [ROOT / "train.py", ROOT / "evaluate.py"]
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in files for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LIMIT]
    assert len(files) > 20 and not long, f"longer than {LIMIT} lines: " + "; ".join(long)
