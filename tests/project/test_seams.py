"""The seams between the parts stay narrow and typed, counted over the production sources' syntax trees:

- below ``streamrec/app/``, no function takes the whole ``Config``: a part takes its own section, or values the
  application derived once (a parameter ``cfg``/``config`` that is unannotated or annotated ``Config`` counts);
- no section is changed by assignment after loading (``cfg.trainer.max_events = ...`` skips the section's
  checks; the application uses ``Config.with_values``);
- another object's private attribute (``x._name``, ``x`` not ``self``/``cls``) is read at most ``MAX_PRIVATE``
  times in all, never in the embedding store, and each such line says why in a comment;
- no function is over ``MAX_FUNCTION_LINES`` lines, and the generic config loader stays small.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.source import SOURCE_TREES, nodes
from tests.project.test_class_size import ROOT, production_modules

pytestmark = SOURCE_TREES

MAX_PRIVATE = 10
DOCUMENTED = {"os._exit", "sys._getframe"}  # standard-library functions whose documented names start with "_"
MAX_FUNCTION_LINES = 80
MAX_LOADER_LINES = 300


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name


def _production() -> list[Path]:
    return [p for p in production_modules() if "_pb2" not in p.name]


def whole_config_parameters(paths) -> list[str]:
    """``"<path> <function>"`` for each function outside the application that takes the whole config."""
    out = []
    for p in paths:
        if _rel(p).startswith("streamrec/app/") or _rel(p) == "streamrec/foundation/config.py":
            continue
        for node in nodes(p):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                for a in args.posonlyargs + args.args + args.kwonlyargs:
                    ann = ast.unparse(a.annotation).strip("'\"") if a.annotation else None
                    if a.arg in ("cfg", "config") and (ann is None or ann.split(".")[-1] == "Config"):
                        out.append(f"{_rel(p)} {node.name}")
    return out


def section_assignments(paths) -> list[str]:
    """``"<path>:<line>"`` for each ``cfg.<section>.<key> = ...`` (or ``config.``) in production code."""
    out = []
    for p in paths:
        for node in nodes(p):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if (isinstance(el, ast.Attribute) and isinstance(el.value, ast.Attribute)
                            and isinstance(el.value.value, ast.Name) and el.value.value.id in ("cfg", "config")):
                        out.append(f"{_rel(p)}:{node.lineno}")
    return out


def private_reads(paths) -> list[tuple[str, str, bool]]:
    """``(path:line, expression, commented)`` for each read of another object's private attribute."""
    out = []
    for p in paths:
        lines = p.read_text().splitlines()
        for node in nodes(p):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and ast.unparse(node) not in DOCUMENTED):
                out.append((f"{_rel(p)}:{node.lineno}", ast.unparse(node), "#" in lines[node.lineno - 1]))
    return out


def long_functions(paths, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    out = []
    for p in paths:
        for node in nodes(p):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{_rel(p)} {node.name} {n}")
    return out


def test_no_part_below_the_application_takes_the_whole_config():
    found = whole_config_parameters(_production())
    assert found == [], "take the section (or the values) the function reads:\n" + "\n".join(found)


def test_no_section_is_changed_by_assignment_after_loading():
    found = section_assignments(_production())
    assert found == [], "use Config.with_values (checked as loaded values are):\n" + "\n".join(found)


def test_private_attributes_of_other_objects_are_rarely_read_and_each_read_says_why():
    found = private_reads(_production())
    assert [w for w, _, _ in found if w.startswith("embedding_store/")] == []
    assert [f"{w} {e}" for w, e, commented in found if not commented] == [], "give the object a public accessor"
    assert len(found) <= MAX_PRIVATE, "\n".join(f"{w} {e}" for w, e, _ in found)


def test_no_production_function_is_over_80_lines():
    assert long_functions(_production()) == [], "split these functions into named steps"


def test_the_generic_config_loader_stays_small():
    assert len((ROOT / "streamrec/foundation/config.py").read_text().splitlines()) <= MAX_LOADER_LINES


def test_the_counters_see_what_they_count(tmp_path):
    """Each counter finds the shape it forbids, so an empty result means something."""
    src = tmp_path / "m.py"
    src.write_text("def f(cfg, x: 'Config'):\n    cfg.trainer.ranks = 2\n    return x._rows  # a reason\n"
                   "def g(trainer: 'TrainerConfig', config: 'TrainerConfig'):\n    return self._ok, y._bad\n"
                   "def h():\n" + "    pass\n" * 80)
    assert whole_config_parameters([src]) == ["m.py f"]
    assert section_assignments([src]) == ["m.py:2"]
    assert private_reads([src]) == [("m.py:3", "x._rows", True), ("m.py:5", "y._bad", False)]
    assert long_functions([src]) == ["m.py h 81"]
