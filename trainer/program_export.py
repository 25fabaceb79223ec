"""The model's dense network as an exported program, for the snapshots of one publisher.

The model is exported once (``streamrec.snapshot.export_dense``; the graph does not hold the weights) and each
snapshot checks the program with its own weights against the module on the probe batch. ``torch.export`` takes
seconds (longer on a loaded machine), longer than a Kafka consumer may go without polling, so a trainer starts
it on a thread of its own (:meth:`DenseProgram.start`) and never waits for it on its poll loop: the publisher
plans no snapshot while it runs (:attr:`DenseProgram.running`). The export works on a deep copy of the model on
the CPU, taken on the caller's thread, so training goes on changing the model's weights meanwhile. A program
nobody started is exported on the first snapshot, on the caller's thread (a snapshot built by hand).

The training thread's forward and backward are the same while the export runs, but ``torch.export`` sets
process-wide flags (``torch.compiler.is_exporting``): an optimizer step that reads them (torch's Adam update,
``dense_optimizers.py``) takes its compile-friendly path meanwhile, the same update rounded differently in the
last bits. The program itself is checked against the module on every snapshot, so a trace disturbed by the
training thread cannot reach serving.

A model that cannot be exported, or whose program scores the probe batch differently, is said in
:attr:`DenseProgram.error` and one error line of the log; its snapshots carry no program.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class DenseProgram:
    """Exports a model's dense network once, in the background or on the first snapshot, and checks the
    program against the module for each snapshot (module doc)."""

    def __init__(self, model_cfg, log: logging.Logger):
        """``model_cfg``: the ``ModelConfig`` of the model (its input widths and tasks); ``log``: where its lines
        go (the publisher's: they are about its snapshots)."""
        self.model_cfg, self.log = model_cfg, log
        self._thread: threading.Thread | None = None  # the export start() began
        self._exported = None  # (ExportedDense, its loaded program module)
        self.error = ""  # why the model has no exported program ("" = it has one, or none tried yet)

    def start(self, model) -> None:
        """Begin exporting ``model`` on a thread of its own and return at once (a deep copy on the CPU is taken
        here). Nothing happens when an export was already started, done or failed."""
        if self._thread is not None or self._exported is not None or self.error:
            return
        self._thread = threading.Thread(target=self._export, args=(_cpu_copy(model),), name="snapshot-export",
                                        daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """The export :meth:`start` began is still running: no snapshot can carry the program yet."""
        t = self._thread
        return t is not None and t.is_alive()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the export :meth:`start` began (logged when it has to wait); False, with a
        warning, when it is still running then."""
        if not self.running:
            return True
        self.log.info("waiting up to %g s for the model's export: a snapshot carries its program", timeout)
        t0 = time.monotonic()
        self._thread.join(timeout)
        if self.running:
            self.log.warning("the model's export is still running after %g s: no snapshot is built", timeout)
            return False
        self.log.info("the model's export ended after %.1f s of waiting", time.monotonic() - t0)
        return True

    def _export(self, cpu_model) -> None:
        """Export ``cpu_model`` into ``_exported``, or say in ``error`` (one error line) why not."""
        from streamrec.snapshot import SnapshotError, export_dense, load_program

        mc = self.model_cfg
        try:
            ex = export_dense(cpu_model, mc.dense_dim, mc.pooled_dim, len(mc.task_names))
            weights = cpu_model.state_dict()
            mod = load_program(ex.program_json, {k: weights[k].detach() for k in ex.weight_keys}, ex.constants)
            self._exported = (ex, mod)
        except SnapshotError as e:
            self.error = str(e)
        except Exception as e:  # a model's own code may raise anything while it is traced
            self.error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        if self.error:
            self.log.error("snapshots carry no exported program (serving builds the model from its code, so the module "
                           "must be importable where serving runs): %s", self.error)

    def entry(self, model, dense_state: dict) -> tuple[dict | None, Any]:
        """The manifest's ``program`` entry for a snapshot of ``model`` with ``dense_state``, and the
        ``ExportedDense`` whose files a full snapshot writes; ``(None, None)`` when the model has no program.
        An export still running is waited for (a snapshot planned before it began); one never started runs
        here."""
        import torch

        from streamrec.snapshot import probe_inputs, task_logits

        if self._thread is not None:
            self._thread.join()
        elif self._exported is None and not self.error:
            self._export(_cpu_copy(model))
        if self._exported is None:
            return None, None
        mc = self.model_cfg
        tasks = list(mc.task_names)
        ex, mod = self._exported
        dense, pooled = probe_inputs(mc.dense_dim, mc.pooled_dim)
        weights = {k: dense_state[k] for k in ex.weight_keys}
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                mod.load_state_dict(weights, strict=False)
                dev = next((p.device for p in model.parameters()), torch.device("cpu"))
                want = task_logits(model(dense.to(dev), pooled.to(dev)), len(tasks), len(dense)).float().cpu()
                got = task_logits(mod(dense, pooled), len(tasks), len(dense))
        finally:
            model.train(was_training)
        exact = torch.equal(got, want) if dev.type == "cpu" else torch.allclose(got, want, rtol=1e-6, atol=1e-6)
        if not exact:
            self.error = (f"the exported program's logits on the probe batch differ from the module's "
                          f"(max |diff| {float((got - want).abs().max()):.3g})")
            self.log.error("snapshots carry no exported program from now on: %s", self.error)
            self._exported = None
            return None, None
        entry = ex.manifest_entry(mc.dense_dim, mc.pooled_dim, tasks)
        entry["probe_logits"] = got.tolist()
        return entry, ex


def _cpu_copy(model):
    import copy

    return copy.deepcopy(model).cpu()
