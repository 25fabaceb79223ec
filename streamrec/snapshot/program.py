"""The dense network as an exported program: what lets serving score a model whose Python code it never imports.

The trainer exports the model with ``torch.export`` (batch size dynamic) and writes three things into a full
snapshot::

    program.json                     the graph (torch.export's own serialized form, as JSON: no pickle)
    program-constants.safetensors    tensors the graph holds that are not in the state dict (non-persistent
                                     buffers, lifted tensor constants); absent when there are none
    dense.safetensors                the weights, as in every snapshot (the program's state dict keys)

Nothing here unpickles: the graph is JSON read into torch's serialization dataclasses, every tensor comes
from safetensors. A delta carries no program of its own: its manifest names the parent's (same sha256) and
only the weights change.

The export is proven before it is written: the program must score :func:`probe_inputs` exactly as the module
does (``torch.equal`` on CPU; within 1e-6 on another device), with logits ``[B, T]``. The logits it gave are
recorded in the manifest, and serving runs the program on the same probe before it swaps the version in:
a program that does not deserialize, raises, returns another shape or other scores is refused
(INVALID_ARGUMENT).

What torch itself writes while it exports (symbolic-shape warnings, Python warnings, the partial FX graph of a
failed trace) is collected into one DEBUG record of this module's logger (``torch_output.py``): the caller
reports the outcome in a line of its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import torch

from .errors import SnapshotError
from .torch_output import torch_output_captured

log = logging.getLogger(__name__)

PROGRAM = "program.json"
PROGRAM_CONSTANTS = "program-constants.safetensors"
PROGRAM_FORMAT = 1
PROBE_ROWS = 8  # events in the probe batch (>= 2: a batch of 1 would let export specialise the batch size)
PROBE_SEED = 0
MAX_BATCH = 1 << 20  # the upper bound of the exported program's dynamic batch dimension
PROBE_RTOL = 1e-5  # serving's probe tolerance: another machine (threads, ISA) may round reductions differently
PROBE_ATOL = 1e-5
MAX_PROGRAM_BYTES = 256 << 20


def probe_inputs(dense_dim: int, pooled_dim: int, rows: int = PROBE_ROWS,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The probe batch: ``dense [rows, dense_dim]`` and ``pooled [rows, pooled_dim]``, standard normal from a
    fixed seed, so the trainer and serving build the same tensors without sending them."""
    g = torch.Generator().manual_seed(PROBE_SEED)
    dense = torch.randn(rows, dense_dim, generator=g)
    pooled = torch.randn(rows, pooled_dim, generator=g)
    return dense.to(device), pooled.to(device)


def task_logits(out: Any, num_tasks: int, rows: int) -> torch.Tensor:
    """``out`` as logits ``[rows, num_tasks]``: a ``[rows]`` output is one task's (accepted when there is one
    task). Raises ``SnapshotError`` (INVALID_ARGUMENT) naming the shape otherwise."""
    if not isinstance(out, torch.Tensor):
        raise SnapshotError(f"program: returns {type(out).__name__}, expected a tensor of logits "
                            f"[batch, {num_tasks}]", code="INVALID_ARGUMENT")
    if out.dim() == 1 and num_tasks == 1 and out.shape[0] == rows:
        return out.unsqueeze(1)
    if out.dim() != 2 or tuple(out.shape) != (rows, num_tasks):
        raise SnapshotError(f"program: returns logits of shape {list(out.shape)} for a batch of {rows}, expected "
                            f"[{rows}, {num_tasks}] (one column per task)", code="INVALID_ARGUMENT")
    return out


@dataclass
class ExportedDense:
    """A model's exported dense network, ready to be written into a snapshot."""

    program_json: bytes
    constants: dict[str, torch.Tensor]
    weight_keys: list[str]  # the program's state dict keys (all in dense.safetensors)
    probe_logits: list[list[float]]  # the module's logits on probe_inputs, [PROBE_ROWS, T]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.program_json).hexdigest()

    def manifest_entry(self, dense_dim: int, pooled_dim: int, tasks: list[str]) -> dict[str, Any]:
        """What the manifest says of the program (``Manifest.program``)."""
        return {
            "format": PROGRAM_FORMAT,
            "file": PROGRAM,
            "sha256": self.sha256,
            "constants": PROGRAM_CONSTANTS if self.constants else None,
            "inputs": [{"name": "dense", "shape": ["batch", int(dense_dim)]},
                       {"name": "pooled", "shape": ["batch", int(pooled_dim)]}],
            "outputs": [{"name": "logits", "shape": ["batch", len(tasks)]}],
            "probe_rows": PROBE_ROWS,
            "probe_logits": self.probe_logits,
            "torch": torch.__version__.split("+")[0],
        }


def export_dense(model: torch.nn.Module, dense_dim: int, pooled_dim: int, num_tasks: int) -> ExportedDense:
    """Export ``model`` (on CPU, eval mode, batch dimension dynamic) and prove the program scores the probe batch
    exactly as the module does. Raises ``SnapshotError`` naming the problem when it cannot be exported or its
    program differs. torch's own output meanwhile is one DEBUG record (module doc)."""
    from torch._export.serde import serialize as S

    was_training = model.training
    model.eval()
    try:
        dense, pooled = probe_inputs(dense_dim, pooled_dim)
        with torch.no_grad():
            want = task_logits(model(dense, pooled), num_tasks, PROBE_ROWS)
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        try:
            with torch_output_captured(log, "exporting the model with torch.export"):
                ep = torch.export.export(model, (dense, pooled), dynamic_shapes=({0: batch}, {0: batch}))
        except Exception as e:
            raise SnapshotError(f"the model cannot be exported with torch.export: {type(e).__name__}: "
                                f"{_first_line(e)}") from None
        weights = model.state_dict()
        missing = [k for k in ep.state_dict if k not in weights]
        if missing:
            raise SnapshotError(f"the exported program needs weight {missing[0]!r} that is not in the state dict")
        constants = {k: v.detach().cpu().contiguous().clone() for k, v in ep.constants.items()}
        if any(not isinstance(v, torch.Tensor) for v in ep.constants.values()):
            raise SnapshotError("the exported program holds a non-tensor constant (a script object)")
        ser = S.ExportedProgramSerializer().serialize(ep, serialize_state_dict=False, serialize_constants=False,
                                                      serialize_example_inputs=False)
        program = S._dataclass_to_dict(ser.exported_program)  # torch.export has no public dict form of a program
        blob = json.dumps(program, cls=S.EnumEncoder).encode()
        weight_keys = sorted(ep.state_dict)
        # the check runs what serving will run: the program read back from its JSON and safetensors-able tensors
        mod = load_program(blob, {k: weights[k].detach().cpu() for k in weight_keys}, constants)
        with torch.no_grad():
            got = task_logits(mod(dense, pooled), num_tasks, PROBE_ROWS)
            want = want.detach().cpu()
            if not torch.equal(got, want):
                diff = float((got - want).abs().max())
                raise SnapshotError(f"the exported program's logits on the probe batch differ from the module's "
                                    f"(max |diff| {diff:.3g})")
    finally:
        model.train(was_training)
    return ExportedDense(blob, constants, weight_keys, want.tolist())


def load_program(program_json: bytes, weights: dict[str, torch.Tensor],
                 constants: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The module of a serialized program with these weights and constants (its state dict keys taken from
    ``weights``; extra keys are ignored). Raises ``SnapshotError`` (INVALID_ARGUMENT) when the JSON is not a
    program this torch can read or a tensor it names is missing."""
    from torch._export.serde import serialize as S

    if len(program_json) > MAX_PROGRAM_BYTES:
        raise SnapshotError(f"{PROGRAM}: {len(program_json)} bytes, the limit is {MAX_PROGRAM_BYTES}",
                            code="INVALID_ARGUMENT")
    try:
        raw = json.loads(program_json)
        check_expressions(raw)
        prog = S._dict_to_dataclass(S.ExportedProgram, raw)  # torch.export has no public dict-to-program reader
        check_operators(prog)
        sig = prog.graph_module.signature
        names = _named_inputs(sig)
        state = {k: torch.nn.Parameter(weights[k], requires_grad=False) for k in names["params"] if k in weights}
        state.update({k: weights[k] for k in names["buffers"] if k in weights})
        need = [k for k in names["params"] + names["buffers"] if k not in weights]
        if need:
            raise SnapshotError(f"{PROGRAM}: needs weight {need[0]!r}, which dense.safetensors does not hold",
                                code="INVALID_ARGUMENT")
        consts = {k: constants[k] for k in names["constants"] if k in constants}
        need = [k for k in names["constants"] if k not in constants]
        if need:
            raise SnapshotError(f"{PROGRAM}: needs constant {need[0]!r}, which {PROGRAM_CONSTANTS} does not hold",
                                code="INVALID_ARGUMENT")
        ep = S.ExportedProgramDeserializer().deserialize(prog, state, consts, None)
        return ep.module()
    except SnapshotError:
        raise
    except Exception as e:  # torch raises many types on a malformed program
        raise SnapshotError(f"{PROGRAM}: not a program this server can load: {type(e).__name__}: "
                            f"{_first_line(e)}", code="INVALID_ARGUMENT") from None


ALLOWED_OP_NAMESPACES = ("torch.ops.aten.", "torch.ops.prims.")
ALLOWED_SYM_PREFIXES = ("_operator.", "math.", "torch.sym_", "torch._sym_")
DENIED_OPS = ("torch.ops.aten.from_file.",)  # reads a file named by the graph


def check_operators(prog) -> None:
    """Every node of a serialized program calls a tensor operator of ``aten`` or ``prims`` (or a symbolic-size
    helper of ``operator``/``math``/``torch.sym_*``): the deserializer resolves a target name to any attribute
    of ``torch``, so a program naming e.g. ``torch.load`` would run it. Control-flow operators (``cond``,
    ``while_loop``), extension and custom operators are refused too. Raises ``SnapshotError``
    (INVALID_ARGUMENT) naming the first other target."""
    for node in prog.graph_module.graph.nodes:
        t = node.target
        ok = isinstance(t, str) and (
            (t.startswith(ALLOWED_OP_NAMESPACES) and not t.startswith(DENIED_OPS))
            or (t.startswith(ALLOWED_SYM_PREFIXES) and "(" not in t))
        if not ok:
            raise SnapshotError(f"{PROGRAM}: calls {str(t)[:120]!r}; a program may call only aten and prims tensor "
                                "operators", code="INVALID_ARGUMENT")


SYM_FUNCTIONS = frozenset({  # the names in torch's printed (sympy srepr) shape expressions
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Max", "Min", "FloorDiv", "Mod", "PythonMod",
    "CeilToInt", "FloorToInt", "TruncToInt", "IntTrueDiv", "FloatTrueDiv", "ToFloat", "Abs", "Eq", "Ne", "Ge", "Gt",
    "Le", "Lt", "StrictLessThan", "LessThan", "GreaterThan", "StrictGreaterThan", "Equality", "Unequality", "And",
    "Or", "Not", "true", "false", "True", "False", "oo", "zoo", "nan", "Infinity", "NegativeInfinity",
    "positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite", "precision",
})
_SYM_TOKEN = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:e[+-]?\d+)?|//|[-+*/%(),<>=!]=?"
                        r"|'(?:[a-z]{1,3}\d{1,9}|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)'")
_SYM_NAME = re.compile(r"[a-z]{1,3}\d{1,9}")  # the shape symbols torch.export names: s0, s77, u3, ...
MAX_EXPR_CHARS = 1000


def check_expressions(raw: Any) -> None:
    """Every symbolic-shape expression (``expr_str``) in a program's JSON is arithmetic over shape symbols and
    the sympy functions torch prints (``SYM_FUNCTIONS``): the deserializer hands these strings to
    ``sympy.sympify``, which evaluates Python. No attribute access, strings (but symbol names and numbers),
    brackets, powers (a huge power takes unbounded time) or other names pass.
    Raises ``SnapshotError`` (INVALID_ARGUMENT) naming the first other expression."""
    stack = [raw]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "expr_str":
                    _check_expression(x)
                else:
                    stack.append(x)
        elif isinstance(v, list):
            stack.extend(v)


def _check_expression(expr: Any) -> None:
    def bad(why: str):
        raise SnapshotError(f"{PROGRAM}: symbolic expression {str(expr)[:80]!r} {why}", code="INVALID_ARGUMENT")

    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS:
        bad(f"is not a string of at most {MAX_EXPR_CHARS} characters")
    if "**" in expr:
        bad("has a power")
    pos = 0
    while pos < len(expr):
        m = _SYM_TOKEN.match(expr, pos)
        if m is None:
            bad(f"has {expr[pos]!r} at {pos}: only arithmetic over shape symbols is accepted")
        tok = m.group(0)
        if (tok[0].isalpha() or tok[0] == "_") and tok not in SYM_FUNCTIONS and not _SYM_NAME.fullmatch(tok):
            bad(f"names {tok[:40]!r}, which is neither a shape symbol nor a function of SYM_FUNCTIONS")
        pos = m.end()


def _named_inputs(sig) -> dict[str, list[str]]:
    """The state dict and constant names a serialized graph signature lifts as inputs."""
    out: dict[str, list[str]] = {"params": [], "buffers": [], "constants": []}
    for spec in sig.input_specs:
        kind = spec.type
        if kind == "parameter":
            out["params"].append(spec.parameter.parameter_name)
        elif kind == "buffer":
            b = spec.buffer
            (out["buffers"] if b.persistent else out["constants"]).append(b.buffer_name)
        elif kind == "tensor_constant":
            out["constants"].append(spec.tensor_constant.tensor_constant_name)
        elif kind not in ("user_input", "token"):
            raise SnapshotError(f"{PROGRAM}: input of kind {kind!r} is not supported (tensors only)",
                                code="INVALID_ARGUMENT")
    return out


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else "")[:300]
