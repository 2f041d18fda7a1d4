"""AST drift: the functions a clean patch touches that changed upstream between the two releases."""

from __future__ import annotations

import ast

from rigstack.gitrepo import PackageRepo
from rigstack.port.state import PortState
from rigstack.stack import Hunk


def _functions(source: str | None) -> dict[str, tuple[int, int, str]]:
    """Qualified name -> (first line, last line, AST dump) of every function; the dump ignores comments and lines."""
    if not source:
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found: dict[str, tuple[int, int, str]] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    found[name] = (child.lineno, child.end_lineno or child.lineno, ast.dump(child))
                walk(child, name + ".")

    walk(tree, "")
    return found


def _drift(repo: PackageRepo, state: PortState, hunks: dict[str, list[Hunk]], moved: dict[str, str],
           head_tree: str) -> list[str]:
    """Functions the patch changes that upstream changed between the two releases."""
    renamed_from = {new: old for old, new in moved.items()}
    warnings = []
    for path, file_hunks in hunks.items():
        if not path.endswith(".py"):
            continue
        spans = _functions(repo.blob_text(head_tree, path))
        names: list[str] = []
        for hunk in file_hunks:
            for line in hunk.changed_old_lines():
                inside = [(first, name) for name, (first, last, _) in spans.items() if first <= line <= last]
                if inside and max(inside)[1] not in names:
                    names.append(max(inside)[1])  # the innermost: the one that starts last
        if not names:
            continue
        new = _functions(repo.blob_text(state.new.commit, path))
        old = _functions(repo.blob_text(state.old.commit, renamed_from.get(path, path)))
        for name in names:
            if name not in new:
                continue  # added by the stack itself
            if name not in old:
                warnings.append(f"vllm/{path}: {name} (new in {state.new.version})")
            elif old[name][2] != new[name][2]:
                warnings.append(f"vllm/{path}: {name}")
    return warnings
